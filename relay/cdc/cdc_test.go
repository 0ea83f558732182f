package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/relay/cdc"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	testenv.Announce("relay/cdc", testenv.Postgres)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

func TestNewValidatesConfig(t *testing.T) {
	pub := newCounting(nil)
	cases := []struct {
		name  string
		opts  []cdc.Option
		field string
	}{
		{"slot", []cdc.Option{cdc.WithSlotName("Bad-Name")}, "slot_name"},
		{"publication", []cdc.Option{cdc.WithPublicationName("")}, "publication_name"},
		{"standby", []cdc.Option{cdc.WithStandbyTimeout(time.Hour)}, "standby_timeout"},
		{"batch", []cdc.Option{cdc.WithMaxBatch(0)}, "max_batch"},
		{"pending bytes", []cdc.Option{cdc.WithMaxPendingBytes(0)}, "max_pending_bytes"},
		{"pending bytes max", []cdc.Option{cdc.WithMaxPendingBytes(cdc.MaxMaxPendingBytes + 1)}, "max_pending_bytes"},
		{"tables", []cdc.Option{cdc.WithTables(ferry.Tables{Schema: "x;drop"})}, "tables.schema"},
		{"heartbeat", []cdc.Option{cdc.WithHeartbeat(time.Microsecond)}, "heartbeat"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := cdc.New("postgres://localhost/db", pub, c.opts...)
			var ce *ferry.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, ferry.ErrInvalidConfig) {
				t.Fatalf("New: got %v, want ConfigError on %s", err, c.field)
			}
		})
	}
	for _, dsn := range []string{"mysql://root@127.0.0.1:3306/test", "root@tcp(127.0.0.1:3306)/test"} {
		_, err := cdc.New(dsn, pub)
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != "conn_string" || !strings.Contains(ce.Reason, "Postgres logical decoding only") {
			t.Fatalf("New(%q): got %v, want a ConfigError refusing MySQL", dsn, err)
		}
	}
	if _, err := cdc.New("postgres://localhost/db", nil); err == nil {
		t.Fatal("New with nil publisher: want error")
	}
	if _, err := cdc.New("postgres://localhost/db", pub); err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	// Metrics register once per slot and registry.
	reg := prometheus.NewRegistry()
	if _, err := cdc.New("postgres://localhost/db", pub, cdc.WithRegisterer(reg)); err != nil {
		t.Fatal(err)
	}
	if _, err := cdc.New("postgres://localhost/db", pub, cdc.WithRegisterer(reg)); err == nil {
		t.Fatal("second relay registering the same slot's metrics: want error")
	}
}

// Events committed while no relay runs are all published once it starts:
// the relay resumes from the slot, not from the current WAL position.
func TestResumeFromSlotAfterDowntime(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	k := startKafka(t)
	pub := newCounting(k.publisher())
	if info, err := cdc.Inspect(ctx, h.s.Pool, h.tables, h.slot); err != nil || info.Exists || info.Recorded {
		t.Fatalf("Inspect before first start: %+v, %v; want no slot, no record", info, err)
	}

	_, stop := h.start(pub)
	first := h.insert(ctx, 20, 4)
	got := k.read(20*time.Second, allDelivered(first))
	if v := judge(first, got); v.lost != 0 || v.orderViolations != 0 {
		t.Fatalf("before downtime: %+v", v)
	}
	waitFor(t, 60*time.Second, "all rows marked sent", func() bool { return h.statusCounts(ctx)["sent"] == 20 })
	stop()

	// Committed while down.
	second := h.insert(ctx, 30, 4)
	_, stop2 := h.start(pub)
	defer stop2()
	all := append(first, second...)
	got = k.read(20*time.Second, allDelivered(all))
	v := judge(all, got)
	if v.lost != 0 || v.phantom != 0 || v.orderViolations != 0 {
		t.Fatalf("after restart: %+v", v)
	}
	// Only the unacknowledged tail may repeat; a clean stop leaves none.
	if v.duplicates != 0 {
		t.Errorf("duplicates after clean stop/restart: %d, want 0", v.duplicates)
	}
	waitFor(t, 60*time.Second, "all rows marked sent", func() bool { return h.statusCounts(ctx)["sent"] == 50 })
}

// The negative control of TestResumeFromSlotAfterDowntime: starting from
// the current WAL position (a known bug elsewhere) loses the rows
// committed while the relay was down. It proves the test can fail.
func TestNegativeControlStartFromCurrentWALLosesRows(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	k := startKafka(t)
	pub := k.publisher()
	_, stop := h.start(pub, cdc.WithFaults(cdc.Faults{StartFromCurrentWAL: true, NoReconcile: true}))
	first := h.insert(ctx, 5, 2)
	k.read(20*time.Second, allDelivered(first))
	stop()
	second := h.insert(ctx, 10, 2)
	_, stop2 := h.start(pub, cdc.WithFaults(cdc.Faults{StartFromCurrentWAL: true, NoReconcile: true}))
	defer stop2()
	third := h.insert(ctx, 5, 2)
	all := append(append(first, second...), third...)
	got := k.read(20*time.Second, allDelivered(third))
	if v := judge(all, got); v.lost == 0 {
		t.Fatalf("starting from the current WAL position lost nothing (%+v): the resume test could not catch the bug", v)
	}
}

// A rolled-back transaction with outbox inserts publishes nothing; nor do
// transactions touching only business tables, updates of outbox rows, or
// logical messages (heartbeats).
func TestRollbackAndBusinessOnlyPublishNothing(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	k := startKafka(t)
	pub := newCounting(k.publisher())
	r, _ := h.start(pub)
	waitFor(t, 60*time.Second, "relay active", func() bool { return r.Status().Role == cdc.RoleActive })

	// Rolled back after writing outbox rows.
	for i := range 5 {
		tx, err := h.s.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.w.InsertTx(ctx, tx, event(fmt.Sprintf("rb-%d", i))); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Business-only transactions, and updates/deletes of outbox rows (not
	// published: the publication is insert-only).
	for i := range 20 {
		if _, err := h.s.Pool.Exec(ctx, `INSERT INTO orders (id, note) VALUES ($1, 'biz')`, fmt.Sprintf("biz-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Logical messages (what WithHeartbeat emits, and a transactional one):
	// the stream runs with messages=false, so pgoutput drops them.
	if _, err := h.s.Pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', '')`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'ferry.heartbeat', 'tx')`); err != nil {
		t.Fatal(err)
	}
	// A marker committed last: once it is at the broker, everything before
	// it in commit order has been decoded.
	marker := h.insert(ctx, 1, 1)
	if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET attempts = attempts`, h.tables.Name("outbox"))); err != nil {
		t.Fatal(err)
	}
	marker2 := h.insert(ctx, 1, 1)
	got := k.read(20*time.Second, allDelivered(append(marker, marker2...)))
	if len(got) != 2 {
		t.Fatalf("broker holds %d messages, want exactly the 2 markers: %+v", len(got), got)
	}
	if v := judge(append(marker, marker2...), got); v.phantom != 0 || v.lost != 0 {
		t.Fatalf("%+v", v)
	}
}

// A publication of that name that publishes something else is refused:
// guessing would publish the wrong rows.
func TestPublicationMismatchStops(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %q FOR TABLE orders`, h.pub)); err != nil {
		t.Fatal(err)
	}
	k := startKafka(t)
	r, err := cdc.New(h.s.URL, k.publisher(), h.relayOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, cdc.ErrPublicationMismatch) {
		t.Fatalf("Run = %v, want ErrPublicationMismatch", err)
	}
	if r.Status().Role != cdc.RoleStopped {
		t.Fatalf("role after Run: %s", r.Status().Role)
	}
}

// An outbox run by polling relays in the watermark design
// (relay.WithSentWatermark) leaves sent rows 'pending': the CDC relay,
// which reads states from the status column, refuses it instead of
// publishing every such row again.
func TestWatermarkOutboxRefused(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	if _, err := h.s.Pool.Exec(ctx, `INSERT INTO ferry_relay_leases (shard, sent_up_to) VALUES (0, 10)`); err != nil {
		t.Fatal(err)
	}
	r, err := cdc.New(h.s.URL, startKafka(t).publisher(), h.relayOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, cdc.ErrPublicationMismatch) || !strings.Contains(err.Error(), "watermark") {
		t.Fatalf("Run = %v, want ErrPublicationMismatch naming the watermark design", err)
	}
}

// A partitioned outbox (migrate.WithPartitionedOutbox) is published via
// the partition root. Producers write for about 10 s into one-second
// partitions, past the ones migrate made, so most rows land in partitions
// the relay created while it streamed (WithPartitionMaintenance): the
// broker holds every committed event exactly once and in order, and every
// row is marked sent in its own partition.
func TestPartitionedOutbox(t *testing.T) {
	ctx := context.Background()
	h := newPartitionedHarness(t, time.Second)
	exec := pgxv5.New(h.s.Pool).Executor()
	made, err := partition.List(ctx, exec, h.tables, partition.Outbox)
	if err != nil || len(made) == 0 {
		t.Fatalf("partitions after migrate: %v %v", made, err)
	}
	migrateEnd := made[len(made)-1].To
	k := startKafka(t)
	h.start(k.publisher(), cdc.WithPartitionMaintenance(200*time.Millisecond))
	var viaRoot bool
	if err := h.s.Pool.QueryRow(ctx, `SELECT pubviaroot FROM pg_publication WHERE pubname = $1`, h.pub).Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("publication %s: publish_via_partition_root = %v (%v), want true", h.pub, viaRoot, err)
	}
	stop := make(chan struct{})
	wait := h.producers(ctx, 2, 20*time.Millisecond, stop)
	time.Sleep(time.Until(migrateEnd) + 2*time.Second)
	close(stop)
	committed := wait()
	got := k.read(30*time.Second, allDelivered(committed))
	if v := judge(committed, got); v.lost != 0 || v.phantom != 0 || v.duplicates != 0 || v.orderViolations != 0 {
		t.Fatalf("%d committed: %+v", len(committed), v)
	}
	waitForState(t, 20*time.Second, "every row marked sent", func() bool { return h.statusCounts(ctx)["sent"] == len(committed) },
		func() any { return h.statusCounts(ctx) })
	var parts, late int
	if err := h.s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(DISTINCT tableoid), count(*) FILTER (WHERE created_at >= $1) FROM %s`,
		h.tables.Name("outbox")), migrateEnd).Scan(&parts, &late); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events over %d partitions, %d of them in partitions the relay created", len(committed), parts, late)
	// Rows after migrateEnd are in partitions the relay created: that is
	// the crossing. (How many partitions the run spans depends on how
	// fast the producers got going: CI 22, on a loaded machine, spanned 7
	// with 128 rows past migrate's, and an earlier "at least 8" failed it.)
	if late == 0 || parts < 2 {
		t.Fatalf("the run did not cross the partitions migrate made: %d partitions, %d rows after %s", parts, late, migrateEnd)
	}
}

// Without the relay's partition maintenance (an interval longer than the
// run) a producer writing past the partitions made at start is refused by
// Postgres: the maintenance is what TestPartitionedOutbox relies on. Not
// a loss (the producer's transaction fails), but an outage of the service.
func TestPartitionedOutboxWithoutMaintenanceRefusesWrites(t *testing.T) {
	ctx := context.Background()
	h := newPartitionedHarness(t, time.Second)
	k := startKafka(t)
	h.start(k.publisher(), cdc.WithPartitionMaintenance(time.Hour))
	parts, err := partition.List(ctx, pgxv5.New(h.s.Pool).Executor(), h.tables, partition.Outbox)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions: %v %v", parts, err)
	}
	time.Sleep(time.Until(parts[len(parts)-1].To) + 200*time.Millisecond)
	_, err = h.w.Insert(ctx, event("late"))
	if err == nil || !strings.Contains(err.Error(), "no partition") {
		t.Fatalf("insert past the last partition: %v, want Postgres' 'no partition of relation' error", err)
	}
}

// On a partitioned outbox a publication that does not publish via the
// partition root is refused, naming the setting: pgoutput would report the
// rows under their partitions, not the outbox, and nothing would be
// published. Once the publication is altered the relay runs.
func TestPartitionedOutboxNeedsPublicationViaRoot(t *testing.T) {
	ctx := context.Background()
	h := newPartitionedHarness(t, time.Hour)
	if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %q FOR TABLE %s WITH (publish = 'insert')`, h.pub, h.tables.Name("outbox"))); err != nil {
		t.Fatal(err)
	}
	k := startKafka(t)
	r, err := cdc.New(h.s.URL, k.publisher(), h.relayOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, cdc.ErrPublicationMismatch) || !strings.Contains(err.Error(), "publish_via_partition_root") {
		t.Fatalf("Run = %v, want ErrPublicationMismatch naming publish_via_partition_root", err)
	}
	if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`ALTER PUBLICATION %q SET (publish = 'insert', publish_via_partition_root = true)`, h.pub)); err != nil {
		t.Fatal(err)
	}
	h.start(k.publisher())
	in := h.insert(ctx, 3, 2)
	got := k.read(20*time.Second, allDelivered(in))
	if v := judge(in, got); v.lost != 0 || v.phantom != 0 || v.duplicates != 0 {
		t.Fatalf("%+v", v)
	}
}

// A transaction larger than one publish batch is published in several
// calls, in order, and confirmed only as a whole.
func TestLargeTransactionSpansBatches(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	k := startKafka(t)
	pub := newCounting(k.publisher())
	h.start(pub, cdc.WithMaxBatch(100))
	evs := make([]ferry.Event, 350)
	for i := range evs {
		evs[i] = event(fmt.Sprintf("o-%d", i%3))
	}
	in, err := h.w.Insert(ctx, evs...)
	if err != nil {
		t.Fatal(err)
	}
	got := k.read(20*time.Second, allDelivered(in))
	if v := judge(in, got); v.lost != 0 || v.duplicates != 0 || v.orderViolations != 0 {
		t.Fatalf("%+v", v)
	}
	if c := pub.calls.Load(); c < 4 {
		t.Fatalf("%d publish calls for 350 events with max batch 100, want >= 4", c)
	}
	waitFor(t, 60*time.Second, "rows sent", func() bool { return h.statusCounts(ctx)["sent"] == 350 })
}
