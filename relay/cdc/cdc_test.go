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

	"github.com/ferryhq/ferry/internal/testenv"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/migrate"
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

// A partitioned outbox (migrate.WithPartitionedOutbox) is refused before
// any publication or slot is made: the CDC relay does not support one yet.
func TestPartitionedOutboxRefused(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	tables := ferry.Tables{Schema: s.Schema}
	if _, err := migrate.Up(ctx, pgxv5.New(s.Pool), tables, migrate.WithPartitionedOutbox(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	h := newHarnessOn(t, s)
	k := startKafka(t)
	r, err := cdc.New(h.s.URL, k.publisher(), h.relayOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, cdc.ErrPartitionedOutbox) {
		t.Fatalf("Run = %v, want ErrPartitionedOutbox", err)
	}
	var pubs int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, h.pub).Scan(&pubs); err != nil || pubs != 0 {
		t.Fatalf("publications made: %d %v", pubs, err)
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
