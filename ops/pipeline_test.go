package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/command"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// dupWindow is the test stream's JetStream duplicate window: short, so a
// replay after it reaches the consumer again (as one after a real 2-minute
// window would).
const dupWindow = 200 * time.Millisecond

// pipeline is the whole path on Postgres: outbox → real relay → embedded
// JetStream → natsjs consumer → inbox (with an authorizer reading current
// policy and a handler that records an external charge in the effect
// ledger) → effect worker against a payment provider stand-in.
type pipeline struct {
	*env
	ib     consumerInbox
	worker *effect.Worker
	psp    *psp
}

// consumerInbox is what the tests use of an *inbox.Inbox[TTx].
type consumerInbox interface {
	ops.Replayer
	Stats() inbox.Stats
}

// psp is the outside payment system: idempotent by key, as real PSPs are.
type psp struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key → charge id
	calls   int
}

func (p *psp) execute(_ context.Context, in effect.Intent) (effect.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	id, ok := p.charges[in.Key]
	if !ok {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[in.Key] = id
	}
	return effect.Result{OperationID: id, Summary: "charged"}, nil
}

func (p *psp) status(_ context.Context, in effect.Intent) (effect.Status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[in.Key]; ok {
		return effect.Status{Lookup: effect.LookupFound, OperationID: id}, nil
	}
	return effect.Status{Lookup: effect.LookupNotFound}, nil
}

func (p *psp) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// newPipeline builds the pipeline on Postgres or SQLite; unordered makes
// the inbox skip its per-aggregate cursor (inbox.WithoutOrdering), so the
// dedup row is the only thing between a redelivery and a second effect.
func newPipeline(t *testing.T, dialect string, unordered bool) *pipeline {
	t.Helper()
	if dialect == "sqlite" {
		e := newSQLite(t)
		return buildPipeline(t, e, sqlite.New(e.sqlDB), unordered)
	}
	if dialect == "mysql" {
		e := newMySQL(t)
		return buildPipeline(t, e, mysql.New(e.sqlDB), unordered)
	}
	e := newPostgres(t)
	return buildPipeline(t, e, pgxv5.New(e.pg.Pool), unordered)
}

// pipelines runs fn on a Postgres, a SQLite and a MySQL pipeline.
func pipelines(t *testing.T, unordered bool, fn func(t *testing.T, p *pipeline)) {
	for _, d := range []string{"postgres", "sqlite", "mysql"} {
		t.Run(d, func(t *testing.T) { fn(t, newPipeline(t, d, unordered)) })
	}
}

func buildPipeline[TTx any](t *testing.T, e *env, drv driver.Driver[TTx], unordered bool) *pipeline {
	t.Helper()
	ctx := context.Background()
	mustExec(t, e, `CREATE TABLE applications (event_id text NOT NULL, consumer text NOT NULL)`)
	mustExec(t, e, `CREATE TABLE revoked (principal varchar(200) PRIMARY KEY)`)

	nc, pub := jetStream(t, "OPSTEST", dupWindow)
	r, err := relay.New(e.db, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, e, r)

	ledger, err := effect.NewLedger(drv)
	if err != nil {
		t.Fatal(err)
	}
	p := &psp{charges: map[string]string{}}
	w, err := effect.NewWorker(ledger, effect.ExecutorFunc(p.execute), effect.ReconcilerFunc(p.status), effect.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// The consumer's business code, written against the driver seam so the
	// same handler runs in a pgx.Tx and a *sql.Tx.
	handler := func(ctx context.Context, tx TTx, ev ferry.Event) error {
		if _, err := drv.UnwrapExecutor(tx).Exec(ctx, `INSERT INTO applications (event_id, consumer) VALUES ($1, 'billing')`, ev.ID.String()); err != nil {
			return err
		}
		_, err := ledger.RecordTx(ctx, tx, effect.Intent{Consumer: "billing", EventID: ev.ID, Step: "charge", TenantID: ev.TenantID,
			Target: "psp", Operation: "charge", Request: []byte(`{"amount":100}`)})
		return err
	}
	authorize := func(ctx context.Context, tx TTx, ev ferry.Event) error {
		rows, err := drv.UnwrapExecutor(tx).Query(ctx, `SELECT count(*) FROM revoked WHERE principal = $1`, ev.Headers.Principal)
		if err != nil {
			return err
		}
		defer rows.Close()
		var n int
		if rows.Next() {
			if err := rows.Scan(&n); err != nil {
				return err
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("principal %s is revoked", ev.Headers.Principal)
		}
		return nil
	}
	iopts := []inbox.Option{inbox.WithAuthorizer(authorize),
		inbox.WithRegisterer(prometheus.NewRegistry()), inbox.WithHealInterval(50 * time.Millisecond)}
	if unordered {
		iopts = append(iopts, inbox.WithoutOrdering())
	}
	ib, err := inbox.New(drv, "billing", handler, iopts...)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := natsjs.NewConsumer(ctx, nc, "OPSTEST", "billing")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(cctx, cons) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox run: %v", err)
		}
		_ = cons.Close()
	})
	return &pipeline{env: e, ib: ib, worker: w, psp: p}
}

func (p *pipeline) applications(t *testing.T, id uuid.UUID) int64 {
	t.Helper()
	return count(t, p.env, `SELECT count(*) FROM applications WHERE event_id = $1`, id.String())
}

func (p *pipeline) sentAfter(t *testing.T, id uuid.UUID, after time.Time) bool {
	t.Helper()
	m, err := p.ops.Message(context.Background(), id.String())
	if err != nil {
		t.Fatal(err)
	}
	return m.Status == "sent" && m.PublishedAt != nil && m.PublishedAt.After(after)
}

// replayAndWait replays one event past the duplicate window and waits
// until the relay republished it and the inbox processed the delivery.
func (p *pipeline) replayAndWait(t *testing.T, id uuid.UUID) {
	t.Helper()
	time.Sleep(dupWindow + 100*time.Millisecond)
	before := p.ib.Stats()
	at := time.Now()
	res, err := p.ops.Replay(context.Background(), ops_filter(id), approve)
	if err != nil || res.Rows != 1 {
		t.Fatalf("replay %+v %v", res, err)
	}
	waitFor(t, "replay published", func() bool { return p.sentAfter(t, id, at.Add(-time.Second)) && p.applicationsOrDup(before) })
}

func (p *pipeline) applicationsOrDup(before inbox.Stats) bool {
	s := p.ib.Stats()
	return s.Duplicates > before.Duplicates || s.Applied > before.Applied || s.Stale > before.Stale
}

func TestParkedUnauthorizedReplayStaysParkedWhilePolicyDenies(t *testing.T) {
	pipelines(t, false, func(t *testing.T, p *pipeline) {
		ctx := context.Background()
		mustExec(t, p.env, `INSERT INTO revoked VALUES ('mallory')`)
		ev := event("7", "order.created")
		ev.Headers.Principal = "mallory"
		ev = p.insert(t, ev)[0]
		var parked []ops_Parked
		waitFor(t, "message parked as unauthorized", func() bool {
			ps, err := p.ops.ListParked(ctx, ops_parkedFilter("billing", "unauthorized"))
			if err != nil {
				t.Fatal(err)
			}
			parked = ps
			return len(ps) == 1
		})
		if parked[0].EventID != ev.ID.String() || parked[0].Principal != "mallory" {
			t.Fatalf("parked row %+v", parked[0])
		}
		st, err := p.ops.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Consumers) != 1 || st.Consumers[0].Consumer != "billing" || len(st.Consumers[0].Parked) != 1 ||
			st.Consumers[0].Parked[0].Reason != "unauthorized" || st.Consumers[0].Parked[0].Count != 1 {
			t.Fatalf("status consumers %+v, want billing with 1 unauthorized parked", st.Consumers)
		}
		tablesToCompare := []string{"inbox", "inbox_parked", "ops_audit", "effects"}
		before := snapshot(t, p.env, tablesToCompare...)
		res, err := p.ops.RequestReplay(ctx, ops_parkedFilter("billing", "unauthorized"), preview)
		if err != nil || res.Rows != 1 || !res.DryRun {
			t.Fatalf("preview %+v %v", res, err)
		}
		if snapshot(t, p.env, tablesToCompare...) != before {
			t.Fatal("replay preview changed the tables")
		}
		if _, err := p.ops.RequestReplay(ctx, ops_parkedFilter("billing", "unauthorized"), ops_approval("")); err == nil {
			t.Fatal("replay without a reason was accepted")
		}

		// Policy still denies: the replay runs the consumer's check and the
		// message stays parked.
		res, err = p.ops.RequestReplay(ctx, ops_parkedFilter("billing", "unauthorized"), approve)
		if err != nil || res.Rows != 1 || res.AuditID == 0 {
			t.Fatalf("request %+v %v", res, err)
		}
		out, err := p.ops.ProcessReplayRequests(ctx, p.ib)
		if err != nil || len(out) != 1 {
			t.Fatalf("process %+v %v", out, err)
		}
		if out[0].Outcome != "parked" || out[0].Reason != "unauthorized" {
			t.Fatalf("replay outcome %+v, want parked again as unauthorized", out[0])
		}
		still, err := p.ops.Parked(ctx, parked[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if still.ResolvedAt != nil || still.Reason != "unauthorized" || still.Attempts <= parked[0].Attempts || still.ReplayRequestedAt != nil {
			t.Fatalf("after a denied replay: %+v (attempts before %d)", still, parked[0].Attempts)
		}
		if n := p.applications(t, ev.ID); n != 0 {
			t.Fatalf("denied message applied %d times", n)
		}
		audit, _ := p.ops.Audit(ctx, 10)
		if len(audit) != 2 || audit[0].Action != "parked.replay.done" || audit[0].Actor != "consumer/billing" || audit[1].Action != "parked.replay" || audit[1].Actor != "alice" {
			t.Fatalf("audit trail %+v", audit)
		}

		// Control: once the policy allows it, the same replay applies it — the
		// outcome above came from the current check, not from the request.
		mustExec(t, p.env, `DELETE FROM revoked WHERE principal = 'mallory'`)
		if _, err := p.ops.RequestReplay(ctx, ops_parkedFilter("billing", "unauthorized"), approve); err != nil {
			t.Fatal(err)
		}
		out, err = p.ops.ProcessReplayRequests(ctx, p.ib)
		if err != nil || len(out) != 1 || out[0].Outcome != "applied" {
			t.Fatalf("replay after the policy changed: %+v %v", out, err)
		}
		if n := p.applications(t, ev.ID); n != 1 {
			t.Fatalf("applied %d times, want 1", n)
		}
		if open, _ := p.ops.ListParked(ctx, ops_parkedFilter("billing", "")); len(open) != 0 {
			t.Fatalf("still parked: %+v", open)
		}
		// Evidence tells the whole story: parked, two requests, two outcomes, applied.
		evd, err := p.ops.Evidence(ctx, ev.ID.String(), "")
		if err != nil {
			t.Fatal(err)
		}
		x := evd.Events[0]
		var actions []string
		for _, a := range x.Audit {
			actions = append(actions, a.Action)
		}
		if got := strings.Join(actions, ","); got != "parked.replay,parked.replay.done,parked.replay,parked.replay.done" {
			t.Fatalf("audit for the event: %s", got)
		}
		if len(x.Parked) != 1 || x.Parked[0].ResolvedAt == nil || x.Parked[0].Reason != "unauthorized" || len(x.Applied) != 1 {
			t.Fatalf("evidence parked %+v applied %+v", x.Parked, x.Applied)
		}
	})
}

func TestEvidencePublishedTwiceAppliedOnceChargedOnce(t *testing.T) {
	pipelines(t, false, func(t *testing.T, p *pipeline) {
		ctx := context.Background()
		ev := event("42", "order.created")
		ev.Headers.CorrelationID = "req-42"
		ev = p.insert(t, ev)[0]
		waitFor(t, "applied", func() bool { return p.applications(t, ev.ID) == 1 })
		if _, err := p.worker.Work(ctx); err != nil {
			t.Fatal(err)
		}
		// Published a second time (an operator replay after the broker's
		// duplicate window): the consumer receives it again and the inbox
		// absorbs it.
		p.replayAndWait(t, ev.ID)
		if _, err := p.worker.Work(ctx); err != nil {
			t.Fatal(err)
		}
		if n := p.applications(t, ev.ID); n != 1 {
			t.Fatalf("applied %d times, want 1", n)
		}
		if p.ib.Stats().Duplicates < 1 {
			t.Fatalf("the second delivery was not absorbed as a duplicate: %+v", p.ib.Stats())
		}
		if n := p.psp.count(); n != 1 {
			t.Fatalf("charged %d times, want 1", n)
		}

		st, err := p.ops.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Consumers) != 1 || st.Consumers[0].AppliedLastMinute != 1 || st.Consumers[0].LastAppliedAt == nil {
			t.Fatalf("status consumers %+v, want billing with 1 applied", st.Consumers)
		}
		if len(st.Effects) != 0 {
			t.Fatalf("status effects %+v, want no open intents once the charge succeeded", st.Effects)
		}
		if len(st.Relays) != 1 || len(st.Relays[0].OwnedShards) != 4 || !st.Relays[0].Live {
			t.Fatalf("status relays %+v, want one live relay owning 4 shards", st.Relays)
		}

		evd, err := p.ops.Evidence(ctx, ev.ID.String(), "")
		if err != nil {
			t.Fatal(err)
		}
		if evd.Kind != "event_id" || len(evd.Events) != 1 {
			t.Fatalf("evidence %+v", evd)
		}
		x := evd.Events[0]
		if x.Committed == nil || x.Committed.TenantID != "acme" || x.Committed.Principal != "alice" || x.Committed.CorrelationID != "req-42" {
			t.Fatalf("committed %+v", x.Committed)
		}
		if x.Published == nil || x.Published.Status != "sent" || x.Published.Publications != 2 || x.Published.Receipt == "" {
			t.Fatalf("published %+v, want sent twice with a receipt", x.Published)
		}
		if len(x.Applied) != 1 || x.Applied[0].Consumer != "billing" {
			t.Fatalf("applied %+v, want exactly one, by billing", x.Applied)
		}
		if len(x.Effects) != 1 || x.Effects[0].State != "succeeded" || x.Effects[0].OperationID != "ch_1" || x.Effects[0].Reconciliations != 0 {
			t.Fatalf("effects %+v, want one succeeded charge ch_1", x.Effects)
		}
		if len(x.Parked) != 0 {
			t.Fatalf("parked %+v", x.Parked)
		}
		want := "committed; published 2 times; applied by 1 consumer(s); effects: 1 succeeded"
		if x.Summary != want {
			t.Fatalf("summary %q, want %q", x.Summary, want)
		}
		// The same story by correlation id.
		byCorr, err := p.ops.Evidence(ctx, "req-42", "")
		if err != nil || byCorr.Kind != "correlation_id" || len(byCorr.Events) != 1 || byCorr.Events[0].Summary != want {
			t.Fatalf("by correlation id: %+v %v", byCorr, err)
		}
		if _, err := p.ops.Evidence(ctx, uuid.NewString(), ""); !errors.Is(err, ops_ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}

		// By command key: a command that wrote an event in its transaction
		// (through pgx; the command package is driver-generic the same way).
		if p.pg == nil {
			return
		}
		drv := pgxv5.New(p.pg.Pool)
		runner, err := command.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		w, err := outbox.New(drv, outbox.WithShardCount(4))
		if err != nil {
			t.Fatal(err)
		}
		out, err := runner.Run(ctx, command.Request{TenantID: "acme", Key: "idem-42", Body: []byte(`{"order":43}`)},
			func(ctx context.Context, tx pgx.Tx) (command.Result, error) {
				evs, err := w.InsertTx(ctx, tx, event("43", "order.created"))
				if err != nil {
					return command.Result{}, err
				}
				return command.Result{Body: []byte("ok"), EventIDs: []uuid.UUID{evs[0].ID}}, nil
			})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "command's event applied", func() bool { return p.applications(t, out.EventIDs[0]) == 1 })
		byKey, err := p.ops.Evidence(ctx, "idem-42", "")
		if err != nil {
			t.Fatal(err)
		}
		if byKey.Kind != "command_key" || byKey.Command == nil || byKey.Command.TenantID != "acme" || len(byKey.Events) != 1 ||
			byKey.Events[0].EventID != out.EventIDs[0].String() || len(byKey.Events[0].Applied) != 1 {
			t.Fatalf("by command key: %+v", byKey)
		}
	})
}

// TestCleanupUnderLoadNeverReappliesRedeliveredEvents runs the
// premature-cleanup scenario: producers and the consumer keep working
// while cleanup deletes in batches; an event still inside the replay
// window is then replayed. With the guard it is absorbed; with an
// unguarded delete (the negative control) it is applied twice. The inbox
// runs without its per-aggregate cursor, which would otherwise also skip
// the redelivery as stale: the dedup row the guard protects is then the
// only defence, as it is for every unordered consumer.
func TestCleanupUnderLoadNeverReappliesRedeliveredEvents(t *testing.T) {
	pipelines(t, true, func(t *testing.T, p *pipeline) {
		ctx := context.Background()
		old := p.insert(t, event("old", "order.created"))[0]
		mid := p.insert(t, event("mid", "order.created"))[0]
		// Applied is not yet sent: the relay marks after the broker's ack and
		// the consumer may apply first. Cleanup deletes only sent rows.
		waitFor(t, "old and mid applied and marked sent", func() bool {
			return p.applications(t, old.ID) == 1 && p.applications(t, mid.ID) == 1 &&
				count(t, p.env, fmt.Sprintf(`SELECT count(*) FROM %s WHERE status = 'sent' AND event_id IN ($1, $2)`, tn("outbox")), old.ID.String(), mid.ID.String()) == 2
		})
		// Age them: old beyond the 7-day window, mid inside it (2 days).
		for _, a := range []struct {
			id  uuid.UUID
			age time.Duration
		}{{old.ID, 10 * 24 * time.Hour}, {mid.ID, 48 * time.Hour}} {
			at := time.Now().Add(-a.age).UTC()
			mustExec(t, p.env, fmt.Sprintf(`UPDATE %s SET created_at = $1, published_at = $1 WHERE event_id = $2`, tn("outbox")), at, a.id.String())
			mustExec(t, p.env, fmt.Sprintf(`UPDATE %s SET applied_at = $1 WHERE event_id = $2`, tn("inbox")), at, a.id.String())
		}

		// Producers keep writing while cleanup runs.
		pctx, stopProducer := context.WithCancel(ctx)
		var produced []uuid.UUID
		var pmu sync.Mutex
		var pwg sync.WaitGroup
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for i := 0; pctx.Err() == nil && i < 200; i++ {
				evs := p.insert(t, event(fmt.Sprint("live-", i%7), "order.created"))
				pmu.Lock()
				produced = append(produced, evs[0].ID)
				pmu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()

		waitFor(t, "producers under way", func() bool { pmu.Lock(); defer pmu.Unlock(); return len(produced) >= 20 })

		// The guard: a retention inside the window is refused.
		if _, err := p.ops.Cleanup(ctx, ops_cleanup(24*time.Hour, 2), approve); !errors.Is(err, ops_ErrRetentionTooShort) {
			t.Fatalf("1-day retention: %v, want ErrRetentionTooShort", err)
		}
		// A valid cleanup, in batches of 2, concurrent with the load.
		res, err := p.ops.Cleanup(ctx, ops_cleanup(8*24*time.Hour, 2), approve)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outbox != 1 || res.Inbox != 1 {
			t.Fatalf("cleanup %+v, want exactly old's outbox and inbox rows", res)
		}
		if _, err := p.ops.Message(ctx, old.ID.String()); !errors.Is(err, ops_ErrNotFound) {
			t.Fatalf("old outbox row still there: %v", err)
		}
		if _, err := p.ops.Message(ctx, mid.ID.String()); err != nil {
			t.Fatalf("mid outbox row deleted: %v", err)
		}

		// mid is redelivered (replayed from the outbox): absorbed.
		p.replayAndWait(t, mid.ID)
		if n := p.applications(t, mid.ID); n != 1 {
			t.Fatalf("guarded: mid applied %d times, want 1", n)
		}

		stopProducer()
		pwg.Wait()
		pmu.Lock()
		live := append([]uuid.UUID(nil), produced...)
		pmu.Unlock()
		if len(live) == 0 {
			t.Fatal("the producer wrote nothing")
		}
		waitFor(t, "every produced event applied", func() bool {
			return count(t, p.env, `SELECT count(DISTINCT event_id) FROM applications`) == int64(len(live)+2)
		})
		if n := count(t, p.env, `SELECT count(*) FROM (SELECT event_id FROM applications GROUP BY event_id HAVING count(*) > 1) d`); n != 0 {
			t.Fatalf("%d events applied more than once under load", n)
		}
		if n := count(t, p.env, fmt.Sprintf(`SELECT count(*) FROM %s`, tn("outbox"))); n != int64(len(live)+1) {
			t.Fatalf("outbox has %d rows, want %d: cleanup deleted a row it should not have", n, len(live)+1)
		}

		// Negative control: the same delete without the guard (a naive "keep
		// one day" job) drops mid's dedup row, and the redelivery is applied
		// a second time.
		mustExec(t, p.env, fmt.Sprintf(`DELETE FROM %s WHERE applied_at < $1`, tn("inbox")), time.Now().Add(-24*time.Hour).UTC())
		p.replayAndWait(t, mid.ID)
		waitFor(t, "mid applied again", func() bool { return p.applications(t, mid.ID) == 2 })
	})
}
