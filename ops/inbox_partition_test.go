package ops_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// inboxStack is a Postgres schema whose inbox is partitioned by day, an
// embedded JetStream server whose stream forgets message ids after
// dupWindow (so a republished event is delivered again, as a replay
// would be), and a running consumer ("shipping") that writes one row per
// applied event into applications. The consumer's clock is now plus
// offset, which sets its claims' applied_at.
type inboxStack struct {
	pg     *testenv.PostgresSchema
	drv    *pgxv5.Driver
	pub    *natsjs.Publisher
	ib     *inbox.Inbox[pgx.Tx]
	offset *atomic.Int64 // nanoseconds added to the consumer's clock
}

func newInboxStack(t *testing.T) *inboxStack {
	t.Helper()
	ctx := context.Background()
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(ctx, drv, tables, migrate.WithPartitionedInbox(24*time.Hour)); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE applications (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	nc, pub := jetStream(t, "INBOXPART", dupWindow)
	s := &inboxStack{pg: pg, drv: drv, pub: pub, offset: new(atomic.Int64)}
	handler := func(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applications (event_id) VALUES ($1)`, ev.ID.String())
		return err
	}
	// Unordered: the per-aggregate cursor would also stop a redelivered
	// sequence 1 (as stale); without it the dedup row is the only thing
	// between a redelivery and a second effect, which is what is tested.
	var err error
	s.ib, err = inbox.New(drv, "shipping", handler, inbox.WithoutOrdering(), inbox.WithRegisterer(prometheus.NewRegistry()),
		inbox.WithLogger(slog.New(slog.DiscardHandler)),
		inbox.WithClock(func() time.Time { return time.Now().Add(time.Duration(s.offset.Load())) }))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := natsjs.NewConsumer(ctx, nc, "INBOXPART", "shipping")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ib.Run(cctx, cons) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox run: %v", err)
		}
		_ = cons.Close()
	})
	return s
}

// deliver publishes ev (again: after the stream's duplicate window) and
// waits until the consumer has decided it: applied or absorbed.
func (s *inboxStack) deliver(t *testing.T, ev ferry.Event) {
	t.Helper()
	time.Sleep(dupWindow + 50*time.Millisecond)
	before := s.ib.Stats()
	for _, r := range s.pub.Publish(context.Background(), []ferry.Event{ev}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	waitFor(t, "delivery of "+ev.ID.String(), func() bool {
		st := s.ib.Stats()
		return st.Applied+st.Duplicates > before.Applied+before.Duplicates
	})
}

func (s *inboxStack) applications(t *testing.T, id uuid.UUID) int {
	t.Helper()
	var n int
	if err := s.pg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM applications WHERE event_id = $1`, id.String()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *inboxStack) exists(t *testing.T, relname string) bool {
	t.Helper()
	var n int
	if err := s.pg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_class WHERE relname = $1 AND relnamespace = current_schema()::regnamespace`, relname).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// inboxEvent is an order event whose id is a UUIDv7 of at (or, zero at, a
// UUIDv4: a producer that does not make v7 ids).
func inboxEvent(t *testing.T, agg string, at time.Time) ferry.Event {
	t.Helper()
	id := uuid.New()
	if !at.IsZero() {
		var err error
		if id, err = partition.UUIDv7At(at); err != nil {
			t.Fatal(err)
		}
	}
	return ferry.Event{ID: id, TenantID: "acme", AggregateType: "order", AggregateID: agg, AggregateSeq: 1,
		EventType: "order.created", SchemaVersion: 1, ContentType: "application/json", Payload: []byte(`{}`),
		OccurredAt: time.Now().UTC(), Topic: "order.events"}
}

// TestInboxPartitionCleanupGuard: on an inbox partitioned by day, with a
// 7-day inbox retention, cleanup drops the partition of an event of 10
// days ago claimed 10 days ago, and keeps — with its reason — the
// partition of an event of 9 days ago replayed and applied today: that
// claim is inside the retention and must absorb the next redelivery. The
// dry run's verdicts equal the run's and change nothing; the row-by-row
// DELETE then removes an old claim of the default partition (a UUIDv4
// event), which stays. A redelivery of the replayed event is absorbed.
// Negative control: the same partition dropped without the guard, and
// the redelivery of that event is applied a second time.
func TestInboxPartitionCleanupGuard(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		name := "guarded"
		if !guarded {
			name = "negative-control-unguarded"
		}
		t.Run(name, func(t *testing.T) { inboxPartitionCleanupGuard(t, guarded) })
	}
}

func inboxPartitionCleanupGuard(t *testing.T, guarded bool) {
	ctx := context.Background()
	s := newInboxStack(t)
	exec := s.drv.Executor()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	oldDay, replayDay := today.Add(-10*24*time.Hour), today.Add(-9*24*time.Hour)
	for _, d := range []time.Time{oldDay, replayDay} {
		if _, err := partition.Create(ctx, exec, tables, partition.Inbox, d, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	oldPart, replayPart := partition.Name(tables, partition.Inbox, oldDay), partition.Name(tables, partition.Inbox, replayDay)

	old := inboxEvent(t, "old", oldDay.Add(time.Hour))
	replayed := inboxEvent(t, "replayed", replayDay.Add(time.Hour))
	v4 := inboxEvent(t, "v4", time.Time{})
	s.offset.Store(int64(-10 * 24 * time.Hour)) // applied 10 days ago
	s.deliver(t, old)
	s.deliver(t, v4)
	s.offset.Store(0) // an old event replayed now
	s.deliver(t, replayed)
	for _, ev := range []ferry.Event{old, replayed, v4} {
		if n := s.applications(t, ev.ID); n != 1 {
			t.Fatalf("%s applied %d times before cleanup", ev.AggregateID, n)
		}
	}

	o, err := ops.New(s.drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opts := ops.CleanupOptions{Retention: 7 * 24 * time.Hour}
	if !guarded {
		// What cleanup would do without the guard: drop the partition,
		// which ended before the cutoff.
		cutoff := time.Now().Add(-opts.Retention)
		parts, err := partition.List(ctx, exec, tables, partition.Inbox)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if p.Name != replayPart {
				continue
			}
			v, err := partition.Drop(ctx, s.drv, tables, partition.Inbox, p, partition.Guard{Cutoff: cutoff, Unguarded: true}, false)
			if err != nil || !v.Dropped {
				t.Fatalf("unguarded drop: %+v %v", v, err)
			}
		}
		if s.exists(t, replayPart) {
			t.Fatal("the unguarded drop left the partition")
		}
		s.deliver(t, replayed)
		if n := s.applications(t, replayed.ID); n != 2 {
			t.Fatalf("negative control: the redelivered event was applied %d times in all; without the guard it must be applied again", n)
		}
		t.Logf("negative control: partition %s dropped without the guard; the redelivery of %s was applied a second time", replayPart, replayed.ID)
		return
	}

	preview, err := o.Cleanup(ctx, opts, ops.Approval{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.exists(t, oldPart) || !s.exists(t, replayPart) {
		t.Fatal("the dry run dropped a partition")
	}
	res, err := o.Cleanup(ctx, opts, approve)
	if err != nil {
		t.Fatal(err)
	}
	verdicts := func(ps []ops.PartitionDrop) string {
		var b strings.Builder
		for _, p := range ps {
			fmt.Fprintf(&b, "%s dropped=%v kept=%q; ", p.Name, p.Dropped, p.Kept)
		}
		return b.String()
	}
	if verdicts(preview.InboxPartitions) != verdicts(res.InboxPartitions) {
		t.Fatalf("dry run and run disagree:\n%s\n%s", verdicts(preview.InboxPartitions), verdicts(res.InboxPartitions))
	}
	got := map[string]ops.PartitionDrop{}
	for _, p := range res.InboxPartitions {
		got[p.Name] = p
	}
	if v := got[oldPart]; !v.Dropped {
		t.Fatalf("partition of old claims %s not dropped: %s", oldPart, verdicts(res.InboxPartitions))
	}
	if v := got[replayPart]; v.Dropped || !strings.Contains(v.Kept, "applied inside the retention") {
		t.Fatalf("partition of the replayed claim %s: %+v, want kept with its reason", replayPart, v)
	}
	if s.exists(t, oldPart) || !s.exists(t, replayPart) || !s.exists(t, partition.DefaultName(tables, partition.Inbox)) {
		t.Fatalf("after cleanup: %s exists=%v, %s exists=%v, default exists=%v", oldPart, s.exists(t, oldPart), replayPart, s.exists(t, replayPart),
			s.exists(t, partition.DefaultName(tables, partition.Inbox)))
	}
	if res.Inbox != 1 {
		t.Fatalf("row-by-row inbox cleanup deleted %d rows, want the v4 event's old claim", res.Inbox)
	}
	var left int
	if err := s.pg.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d claims left (%v), want only the replayed event's", left, err)
	}
	s.deliver(t, replayed)
	if n := s.applications(t, replayed.ID); n != 1 {
		t.Fatalf("the replayed event was applied %d times after cleanup", n)
	}
	t.Logf("verdicts: %s; row cleanup deleted %d; the redelivery of the kept claim was absorbed", verdicts(res.InboxPartitions), res.Inbox)
}

// inboxTable matches the inbox itself in a statement (not inbox_parked,
// inbox_cursor).
var inboxTable = regexp.MustCompile(`ferry_inbox"?(\s|$|\))`)

// inboxRelation matches the inbox and its partitions in a plan.
var inboxRelation = regexp.MustCompile(`^ferry_inbox(_default|_p[0-9]{8}_[0-9]{6})?$`)

// TestInboxPartitionedPlans: on an inbox partitioned by day holding
// 210,000 claims over 7 days and 7,000 UUIDv4 claims in the default
// partition, the ops statements that read the inbox — evidence by event
// id, status per consumer — scan no partition sequentially, and the
// evidence lookup by event id reads one partition (through the event id
// index). Control: the same lookup on a plain inbox of the same claims
// is a sequential scan — the plain inbox has no index on event_id alone.
func TestInboxPartitionedPlans(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 217,000-claim inbox; not with -short")
	}
	ctx := context.Background()
	day := time.Now().UTC().Truncate(24 * time.Hour)
	for _, partitioned := range []bool{true, false} {
		pg := testenv.NewPostgresSchema(t)
		drv := pgxv5.New(pg.Pool)
		var mopts []migrate.Option
		if partitioned {
			mopts = append(mopts, migrate.WithPartitionedInbox(24*time.Hour))
		}
		if _, err := migrate.Up(ctx, drv, tables, mopts...); err != nil {
			t.Fatal(err)
		}
		if partitioned {
			for d := 1; d <= 6; d++ {
				if _, err := partition.Create(ctx, drv.Executor(), tables, partition.Inbox, day.Add(-time.Duration(d)*24*time.Hour), 24*time.Hour); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, q := range []string{
			`INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
SELECT 'c' || (g % 3), 'acme' || (g % 5),
    (lpad(to_hex((extract(epoch FROM $1::timestamptz) * 1000)::bigint - (g % 7) * 86400000 + g), 12, '0') || '7' || substr(md5(g::text), 1, 19))::uuid,
    '\x00', 'order', 'o' || g, 1, 'order.created', $1::timestamptz - (g % 7) * interval '1 day'
FROM generate_series(1, 210000) g`,
			`INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
SELECT 'c' || (g % 3), 'acme', gen_random_uuid(), '\x00', 'order', 'v' || g, 1, 'order.created', $1::timestamptz FROM generate_series(1, 7000) g`,
		} {
			if _, err := pg.Pool.Exec(ctx, q, day.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pg.Pool.Exec(ctx, `VACUUM ANALYZE ferry_inbox`); err != nil {
			t.Fatal(err)
		}
		var id uuid.UUID
		if err := pg.Pool.QueryRow(ctx, `SELECT event_id FROM ferry_inbox WHERE aggregate_id = 'o100003'`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		rec := &recordDB{DB: drv}
		o, err := ops.New(rec, ops.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := o.Evidence(ctx, id.String(), ops.KindEventID); err != nil || len(ev.Events) != 1 || len(ev.Events[0].Applied) != 1 {
			t.Fatalf("evidence of %s: %+v %v", id, ev, err)
		}
		evidence := rec.Take()
		if _, err := o.Status(ctx); err != nil {
			t.Fatal(err)
		}
		status := rec.Take()
		for _, c := range []struct {
			what  string
			stmts []testenv.Statement
		}{{"evidence", evidence}, {"status", status}} {
			n := 0
			for _, st := range c.stmts {
				if !inboxTable.MatchString(st.SQL) || strings.Contains(st.SQL, "information_schema") {
					continue
				}
				n++
				seq, scanned := inboxScans(t, pg.Pool, st.SQL, st.Args...)
				switch {
				case len(seq) > 0:
					t.Errorf("%s: sequential scans of %v\n%s", c.what, seq, st.SQL)
				case c.what == "evidence" && partitioned && strings.Contains(st.SQL, "event_id = $1") && len(scanned) != 1:
					t.Errorf("evidence lookup reads %d inbox partitions (%v), want 1", len(scanned), scanned)
				case c.what == "evidence":
					t.Logf("evidence: %v", scanned)
				default:
					t.Logf("%s: %s", c.what, summarise(scanned))
				}
			}
			if n == 0 {
				t.Fatalf("%s: no statement read the inbox", c.what)
			}
		}
		if !partitioned {
			// The plain inbox's evidence walks its 18 (consumer, tenant)
			// pairs (3 consumers × acme0..acme4 and acme). The control: the lookup by event id alone, as it
			// was, reads the whole table.
			steps := 0
			for _, st := range evidence {
				if strings.Contains(st.SQL, "i.event_id = $1") {
					steps++
				}
			}
			if steps != 19 {
				t.Errorf("plain inbox evidence ran %d pair steps, want 19 (18 pairs and the end)", steps)
			}
			seq, scanned := inboxScans(t, pg.Pool, `SELECT consumer, tenant_id, applied_at, fingerprint FROM ferry_inbox WHERE event_id = $1`, id)
			if len(seq) == 0 {
				t.Errorf("control: the lookup by event id alone is not a sequential scan: %v", scanned)
			}
		}
	}
}

// summarise counts scans by kind: "15 relations: 8 Index Only Scan, 7
// Seq Scan (empty)".
func summarise(scanned map[string]string) string {
	kinds := map[string]int{}
	for _, v := range scanned {
		kind, _, _ := strings.Cut(v, " ferry_")
		kinds[kind]++
	}
	return fmt.Sprintf("%d inbox relations scanned: %v", len(scanned), kinds)
}

// inboxScans runs EXPLAIN (ANALYZE) on one statement and returns the
// inbox relations (the table or its partitions) it scanned sequentially
// with rows in them, and every inbox relation scan executed, by node type
// and index.
func inboxScans(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (seq []string, scanned map[string]string) {
	t.Helper()
	var raw []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", sql, err)
	}
	scanned = map[string]string{}
	testenv.WalkPlan(t, raw, func(n map[string]any) {
		rel, _ := n["Relation Name"].(string)
		if !inboxRelation.MatchString(rel) {
			return
		}
		loops, _ := n["Actual Loops"].(float64)
		if loops == 0 {
			return // pruned at run time
		}
		typ, _ := n["Node Type"].(string)
		ix, _ := n["Index Name"].(string)
		scanned[rel] = strings.TrimSpace(typ + " " + ix)
		rows, _ := n["Actual Rows"].(float64)
		removed, _ := n["Rows Removed by Filter"].(float64)
		if typ == "Seq Scan" && rows+removed > 0 {
			seq = append(seq, rel)
		}
	})
	return seq, scanned
}
