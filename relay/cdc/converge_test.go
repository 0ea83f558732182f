package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/relay/cdc"
)

// faultsFrom parses the child's FAULTS list (comma-separated names).
func faultsFrom(s string) cdc.Faults {
	var f cdc.Faults
	for _, n := range strings.Split(s, ",") {
		switch strings.TrimSpace(n) {
		case "confirm-before-mark":
			f.ConfirmBeforeMark = true
		case "no-reconcile":
			f.NoReconcile = true
		case "no-visibility-wait":
			f.NoVisibilityWait = true
		}
	}
	return f
}

// producers commit outbox transactions from n goroutines until stop is
// closed: 1-3 events each, a fifth of them rolled back. It returns the
// committed events once they have all returned.
func (h *harness) producers(ctx context.Context, n int, pause time.Duration, stop <-chan struct{}) func() []ferry.Event {
	var mu sync.Mutex
	var committed []ferry.Event
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tx, err := h.s.Pool.Begin(ctx)
				if err != nil {
					h.t.Error(err)
					return
				}
				evs := make([]ferry.Event, 1+i%3)
				for j := range evs {
					evs[j] = event(fmt.Sprintf("w%d-agg-%d", w, (i+j)%5))
				}
				evs, err = h.w.InsertTx(ctx, tx, evs...)
				if err != nil {
					h.t.Error(err)
					_ = tx.Rollback(ctx)
					return
				}
				if rand.IntN(5) == 0 {
					_ = tx.Rollback(ctx)
				} else if err := tx.Commit(ctx); err != nil {
					h.t.Error(err)
					return
				} else {
					mu.Lock()
					committed = append(committed, evs...)
					mu.Unlock()
				}
				time.Sleep(time.Duration(rand.Int64N(int64(pause) + 1)))
			}
		}()
	}
	return func() []ferry.Event {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return committed
	}
}

// rowState is the relay's record of one event in the outbox table.
type rowState struct {
	status, receipt string
}

func (h *harness) rowStates(ctx context.Context, pool *pgxpool.Pool) map[string]rowState {
	h.t.Helper()
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT event_id::text, status, coalesce(broker_receipt, '') FROM %s`, h.tables.Name("outbox")))
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]rowState{}
	for rows.Next() {
		var id string
		var st rowState
		if err := rows.Scan(&id, &st.status, &st.receipt); err != nil {
			h.t.Fatal(err)
		}
		out[id] = st
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// disagreements compares the table with the broker for every committed
// event: on the broker <=> marked sent, and a sent row's receipt names a
// stored copy of that very event (Kafka offset of the one-partition topic).
func disagreements(committed []ferry.Event, table map[string]rowState, got []record) []string {
	byOffset := map[int64]string{}
	onBroker := map[string]bool{}
	for _, r := range got {
		byOffset[r.offset] = r.id
		onBroker[r.id] = true
	}
	var out []string
	for _, e := range committed {
		id := e.ID.String()
		row, ok := table[id]
		switch {
		case !ok:
			out = append(out, id+": no outbox row")
		case onBroker[id] && row.status != "sent":
			out = append(out, fmt.Sprintf("%s: on the broker but the table says %s (receipt %q)", id, row.status, row.receipt))
		case !onBroker[id] && row.status == "sent":
			out = append(out, id+": marked sent but not on the broker")
		case row.status == "sent":
			var rc broker.Receipt
			if err := json.Unmarshal([]byte(row.receipt), &rc); err != nil {
				out = append(out, fmt.Sprintf("%s: sent with an unreadable receipt %q", id, row.receipt))
			} else if byOffset[rc.Offset] != id {
				out = append(out, fmt.Sprintf("%s: receipt names offset %d, which holds %q", id, rc.Offset, byOffset[rc.Offset]))
			}
		}
	}
	return out
}

// killRun is one SIGKILL run: producers write while a relay subprocess is
// SIGKILLed kills times (the first kill early, while the first start's
// catch-up from the table runs; later ones at random moments mid-stream,
// some while a restarted relay streams its backlog); then a relay with the
// same settings runs until the broker holds every committed event.
type killRun struct {
	kills       int
	env         []string // child settings: FAULTS=..., FLUSH=..., RECONCILE=...
	final       []cdc.Option
	settleFor   time.Duration // how long the table may take to agree
	wantAgree   bool
	downBetween time.Duration // relay down after a kill: a backlog builds up
	life        time.Duration // a relay lives 200ms + up to this before its kill (default 900ms)
	// writers and pause shape the load (default 4 writers, pausing up to
	// 3ms after each transaction).
	writers int
	pause   time.Duration
	// partition, when set, runs on an outbox partitioned in ranges of it:
	// the run crosses several partition boundaries.
	partition time.Duration
}

func (kr killRun) run(t *testing.T) {
	ctx := context.Background()
	newH := newHarness
	if kr.partition > 0 {
		newH = func(t testing.TB) *harness { return newPartitionedHarness(t, kr.partition) }
	}
	h := newH(t)
	k := startKafka(t)
	stop := make(chan struct{})
	writers, pause := kr.writers, kr.pause
	if writers == 0 {
		writers, pause = 4, 3*time.Millisecond
	}
	if kr.partition > 0 {
		// A backstop 3 intervals ahead, below the relays' DefaultAhead: a
		// relay keeps partitions ahead only while it runs, and here the
		// intervals are seconds while a killed child's successor may take
		// seconds to start on a loaded machine (no deployment partitions by
		// the second). It creates nothing while the relays keep up.
		bctx, stopBackstop := context.WithCancel(ctx)
		var backstop sync.WaitGroup
		backstop.Add(1)
		created := 0
		go func() {
			defer backstop.Done()
			for bctx.Err() == nil {
				names, err := partition.Ensure(bctx, pgxv5.New(h.s.Pool).Executor(), h.tables, partition.Outbox, time.Now(), 0, 3)
				if err != nil && bctx.Err() == nil {
					t.Errorf("partition backstop: %v", err)
					return
				}
				created += len(names)
				select {
				case <-bctx.Done():
				case <-time.After(kr.partition / 2):
				}
			}
		}()
		defer func() {
			stopBackstop()
			backstop.Wait()
			t.Logf("the test's partition backstop created %d partitions", created)
		}()
	}
	wait := h.producers(ctx, writers, pause, stop)
	time.Sleep(300 * time.Millisecond) // rows before the slot exists: the first start catches them up
	for i := range kr.kills {
		before := h.confirmed(ctx)
		cmd := h.startChild(t, k, kr.env...)
		life := kr.life
		if life == 0 {
			life = 900 * time.Millisecond
		}
		d := 200*time.Millisecond + time.Duration(rand.Int64N(int64(life)))
		if i == 0 {
			d = time.Duration(50+rand.IntN(200)) * time.Millisecond // mid catch-up
		} else {
			// The life counts from the child's first confirmation, not its
			// start: under -race on a loaded machine a child can take longer
			// to start than its life, and a child killed before it streamed
			// injects no fault (CI once saw all five of the control's
			// children die idle, so the broken relay never ran).
			// On a timeout, say what the child and the server were doing
			// (a full run once timed out here with nothing else to go on).
			state := func() any { return h.childState(ctx, cmd) }
			if before == 0 { // the slot's creation sets a position: not yet a confirmation
				waitForState(t, time.Minute, fmt.Sprintf("relay child %d to create the slot", i),
					func() bool { before = h.confirmed(ctx); return before != 0 }, state)
			}
			waitForState(t, time.Minute, fmt.Sprintf("relay child %d to confirm a position", i),
				func() bool { return h.confirmed(ctx) != before }, state)
		}
		time.Sleep(d)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if testing.Verbose() {
			t.Logf("kill %d after %v: slot confirmed %s, table %v", i, d, h.confirmed(ctx), h.statusCounts(ctx))
		}
		time.Sleep(time.Duration(rand.Int64N(int64(kr.downBetween) + 1)))
	}
	close(stop)
	committed := wait()
	if len(committed) < 100 {
		t.Fatalf("only %d events committed: the run did not exercise the relay", len(committed))
	}
	pre := disagreements(committed, h.rowStates(ctx, h.s.Pool), k.read(time.Second, func([]record) bool { return false }))
	t.Logf("after the last kill: table %v, %d rows disagree with the broker", h.statusCounts(ctx), len(pre))
	fr, stopRelay := h.start(k.publisher(), kr.final...)
	defer stopRelay()
	defer func() { t.Logf("final relay: %+v", fr.Status()) }()
	got := k.read(90*time.Second, allDelivered(committed))
	v := judge(committed, got)
	if v.lost != 0 || v.phantom != 0 {
		t.Fatalf("broker side: lost=%d phantom=%d (of %d committed)", v.lost, v.phantom, len(committed))
	}
	var bad []string
	deadline := time.Now().Add(kr.settleFor)
	for {
		bad = disagreements(committed, h.rowStates(ctx, h.s.Pool), k.read(20*time.Second, allDelivered(committed)))
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d kills, %d events committed, %d records at the broker (%d duplicates), %d table/broker disagreements",
		kr.kills, len(committed), len(got), v.duplicates, len(bad))
	switch {
	case kr.wantAgree && len(bad) > 0:
		t.Errorf("table and broker disagree on %d events, e.g.:\n%s", len(bad), strings.Join(bad[:min(5, len(bad))], "\n"))
	case !kr.wantAgree && len(bad) == 0:
		t.Errorf("negative control: the broken relay left the table agreeing with the broker; the check cannot fail")
	}
}

// TestSIGKILLTableAgreesWithBroker: the relay runs as a subprocess,
// SIGKILLed 10 times at random moments (mid catch-up, mid-stream, mid
// backlog); afterwards, for every committed event, the outbox row is
// 'sent' exactly when the broker holds the event, and its receipt names the
// stored copy. Issue #23's acceptance check, on the table rather than the
// stream.
func TestSIGKILLTableAgreesWithBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	killRun{kills: 10, wantAgree: true, settleFor: 30 * time.Second, downBetween: 300 * time.Millisecond,
		env:   []string{"RECONCILE=200ms"},
		final: []cdc.Option{cdc.WithReconcileInterval(200 * time.Millisecond)}}.run(t)
}

// TestSIGKILLTableAgreesWithBrokerPartitioned is the same on an outbox
// partitioned by the second: rows land in a dozen partitions, most of
// them created by the relay processes (each start creates partitions
// ahead), and every one of them reaches the broker and is marked in its
// partition.
func TestSIGKILLTableAgreesWithBrokerPartitioned(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	killRun{kills: 10, wantAgree: true, settleFor: 30 * time.Second, downBetween: 300 * time.Millisecond, partition: time.Second,
		env:   []string{"RECONCILE=200ms"},
		final: []cdc.Option{cdc.WithReconcileInterval(200 * time.Millisecond)}}.run(t)
}

// TestSIGKILLConfirmBeforeMarkControl is the negative control: a relay
// that confirms a batch's LSN at the broker's ack, before its rows are
// marked (slow marks: 300ms flush interval), and does not reconcile. A
// SIGKILL between the confirmation and the mark leaves published rows
// pending behind the slot, and the table disagrees with the broker for
// good. The second half runs the same broken order with the reconciler on:
// the table converges, which is what the reconciler is for.
func TestSIGKILLConfirmBeforeMarkControl(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	t.Run("no-reconcile", func(t *testing.T) {
		f := cdc.Faults{ConfirmBeforeMark: true, NoReconcile: true}
		killRun{kills: 5, wantAgree: false, settleFor: 3 * time.Second, life: 3 * time.Second, writers: 1, pause: 10 * time.Millisecond,
			env:   []string{"FAULTS=confirm-before-mark,no-reconcile", "FLUSH=1500ms"},
			final: []cdc.Option{cdc.WithFaults(f), cdc.WithFlushInterval(1500 * time.Millisecond)}}.run(t)
	})
	t.Run("reconciled", func(t *testing.T) {
		f := cdc.Faults{ConfirmBeforeMark: true}
		killRun{kills: 8, wantAgree: true, settleFor: 30 * time.Second,
			env: []string{"FAULTS=confirm-before-mark", "FLUSH=300ms", "RECONCILE=200ms"},
			final: []cdc.Option{cdc.WithFaults(f), cdc.WithFlushInterval(300 * time.Millisecond),
				cdc.WithReconcileInterval(200 * time.Millisecond)}}.run(t)
	})
}

// TestRowsDecodedBeforeVisible reproduces the root cause of issue #23
// deterministically. Postgres sends a transaction to logical decoding as
// soon as its commit record is flushed, but other sessions see its rows
// only once the committing backend leaves the proc array, a moment later —
// normally microseconds, longer for a backend descheduled on a loaded
// machine. A relay that publishes within that moment and marks with
// UPDATE ... WHERE status = 'pending' finds no row, confirms the LSN
// anyway, and the published row stays pending for ever.
//
// Synchronous replication stretches the moment at will: on a throwaway
// cluster whose synchronous standby is the relay itself, the producer's
// commit waits (after the WAL flush, before becoming visible) until the
// relay confirms the transaction — so the relay always publishes and marks
// rows nobody can see yet. The old relay (no visibility check, no
// reconciler) leaves every such row pending; the fixed relay's mark finds
// them missing, waits, gives up after its bound (here the wait can never
// end: it is what releases the producer), and its reconciler re-publishes
// and marks them once the slot has passed them.
func TestRowsDecodedBeforeVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Postgres cluster of its own")
	}
	pg := testenv.NewThrowawayPostgres(t, map[string]string{
		"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8",
		// Only the producer below waits for the standby (it sets
		// synchronous_commit = on); everything else commits locally.
		"synchronous_commit": "local", "synchronous_standby_names": "ferry_sync",
	})
	for _, tc := range []struct {
		name      string
		faults    cdc.Faults
		wantAgree bool
	}{
		{"old-relay", cdc.Faults{NoVisibilityWait: true, NoReconcile: true}, false},
		{"fixed", cdc.Faults{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarnessOn(t, testenv.NewPostgresSchemaAt(t, pg.URL))
			k := startKafka(t)
			// The relay's walsender is the synchronous standby.
			url := h.s.URL + "&application_name=ferry_sync" // testenv's URL carries search_path already
			r, err := cdc.New(url, k.publisher(), h.relayOpts(cdc.WithFaults(tc.faults), cdc.WithReconcileInterval(200*time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			defer func() { cancel(); <-done }()
			waitFor(t, 30*time.Second, "relay streaming", func() bool { st := r.Status(); return st.Role == cdc.RoleActive && !st.CatchingUp })

			// A connection of its own: a pooled one would carry the
			// setting into the cleanup's statements.
			conn, err := pgx.Connect(ctx, h.s.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
				t.Fatal(err)
			}
			var committed []ferry.Event
			for i := range 3 {
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := h.w.InsertTx(ctx, tx, event(fmt.Sprintf("o-%d", i)))
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil { // returns once the relay confirmed it
					t.Fatal(err)
				}
				committed = append(committed, evs...)
			}
			got := k.read(30*time.Second, allDelivered(committed))
			if v := judge(committed, got); v.lost != 0 {
				t.Fatalf("lost %d events at the broker", v.lost)
			}
			var bad []string
			deadline := time.Now().Add(map[bool]time.Duration{true: 30 * time.Second, false: 2 * time.Second}[tc.wantAgree])
			for {
				bad = disagreements(committed, h.rowStates(ctx, h.s.Pool), k.read(20*time.Second, allDelivered(committed)))
				if len(bad) == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			st := r.Status()
			t.Logf("%s: %d committed, %d disagreements, %d reconciled", tc.name, len(committed), len(bad), st.Reconciled)
			if tc.wantAgree && len(bad) > 0 {
				t.Errorf("table disagrees with the broker: %s", strings.Join(bad, "; "))
			}
			if tc.wantAgree && st.Reconciled == 0 {
				t.Errorf("Status.Reconciled = 0: the rows were not repaired by the reconciler")
			}
			if !tc.wantAgree && len(bad) != len(committed) {
				t.Errorf("old relay: %d of %d rows disagree, want all (every row was marked before it was visible)", len(bad), len(committed))
			}
		})
	}
}

// lateStandby is a physical replication client named name that reports
// each WAL position as flushed only delay after it received it: a
// synchronous standby that releases commits late. It runs until ctx ends.
func lateStandby(t *testing.T, ctx context.Context, url, name string, delay time.Duration) <-chan struct{} {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "true"
	cfg.RuntimeParams["application_name"] = name
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	slot := randName("ferry_late_")
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "", pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.PhysicalReplication}); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, sys.XLogPos, pglogrepl.StartReplicationOptions{Mode: pglogrepl.PhysicalReplication}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = conn.Close(context.Background()) }()
		type seen struct {
			at  time.Time
			lsn pglogrepl.LSN
		}
		var queue []seen
		var flushed pglogrepl.LSN
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			msg, err := conn.ReceiveMessage(rctx)
			cancel()
			if err == nil {
				if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 0 && cd.Data[0] == pglogrepl.XLogDataByteID {
					if x, err := pglogrepl.ParseXLogData(cd.Data[1:]); err == nil {
						queue = append(queue, seen{time.Now(), x.WALStart + pglogrepl.LSN(len(x.WALData))})
					}
				}
			} else if !pgconn.Timeout(err) {
				return
			}
			for len(queue) > 0 && time.Since(queue[0].at) >= delay {
				flushed, queue = queue[0].lsn, queue[1:]
			}
			_ = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: flushed, WALFlushPosition: flushed, WALApplyPosition: flushed})
		}
	}()
	return done
}

// TestMarkWaitsForVisibility: the relay's own wait, without the
// reconciler. The producer's commit is released by a second synchronous
// standby that acknowledges 300ms late (ANY 1 of the relay and it, and the
// relay cannot acknowledge before its mark), so the relay decodes, publishes
// and marks each row about 300ms before the row is visible. The mark finds
// the row missing, waits, and marks it once visible: the table agrees with
// the broker and nothing needed the reconciler. With NoVisibilityWait (the
// old relay) the same run leaves the rows pending.
func TestMarkWaitsForVisibility(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Postgres cluster of its own")
	}
	pg := testenv.NewThrowawayPostgres(t, map[string]string{
		"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8", "synchronous_commit": "local",
	})
	ctx := context.Background()
	admin := poolFor(t, pg.URL)
	if _, err := admin.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (ferry_sync, ferry_late)'`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "synchronous_standby_names reloaded", func() bool {
		var v string
		return admin.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&v) == nil && strings.Contains(v, "ferry_late")
	})
	sctx, stopStandby := context.WithCancel(ctx)
	standbyDone := lateStandby(t, sctx, pg.URL, "ferry_late", 300*time.Millisecond)
	defer func() { stopStandby(); <-standbyDone }()
	for _, tc := range []struct {
		name      string
		faults    cdc.Faults
		wantAgree bool
	}{
		{"wait", cdc.Faults{NoReconcile: true}, true},
		{"old-relay", cdc.Faults{NoReconcile: true, NoVisibilityWait: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessOn(t, testenv.NewPostgresSchemaAt(t, pg.URL))
			k := startKafka(t)
			r, err := cdc.New(h.s.URL+"&application_name=ferry_sync", k.publisher(), h.relayOpts(cdc.WithFaults(tc.faults))...)
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			defer func() { cancel(); <-done }()
			waitFor(t, 30*time.Second, "relay streaming", func() bool { st := r.Status(); return st.Role == cdc.RoleActive && !st.CatchingUp })
			conn, err := pgx.Connect(ctx, h.s.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
				t.Fatal(err)
			}
			var committed []ferry.Event
			for i := range 5 {
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := h.w.InsertTx(ctx, tx, event(fmt.Sprintf("o-%d", i)))
				if err != nil {
					t.Fatal(err)
				}
				began := time.Now()
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				// The fixed relay cannot confirm before the row is visible,
				// so the late standby releases the commit; the old relay
				// marks (nothing), confirms and releases it at once.
				if d := time.Since(began); tc.wantAgree && d < 250*time.Millisecond {
					t.Fatalf("commit returned after %v: the late standby did not hold it", d)
				}
				committed = append(committed, evs...)
			}
			got := k.read(30*time.Second, allDelivered(committed))
			time.Sleep(500 * time.Millisecond) // the last mark
			bad := disagreements(committed, h.rowStates(ctx, h.s.Pool), got)
			t.Logf("%s: %d committed, %d disagreements", tc.name, len(committed), len(bad))
			switch {
			case tc.wantAgree && len(bad) > 0:
				t.Errorf("table disagrees with the broker: %s", strings.Join(bad, "; "))
			case !tc.wantAgree && len(bad) == 0:
				t.Errorf("old relay: every row agrees; the rows were visible before the mark and the test shows nothing")
			}
		})
	}
}
