package cdc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay/cdc"
)

// harness is one isolated schema with Ferry's tables, a business table, an
// outbox writer and a unique slot and publication (dropped at cleanup).
type harness struct {
	t      testing.TB
	s      *testenv.PostgresSchema
	tables ferry.Tables
	w      *outbox.Writer[pgx.Tx]
	slot   string
	pub    string
}

func randName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	return newHarnessOn(t, testenv.NewPostgresSchema(t))
}

// newPartitionedHarness is newHarness on an outbox partitioned by
// created_at in ranges of interval (migrate.WithPartitionedOutbox).
func newPartitionedHarness(t testing.TB, interval time.Duration) *harness {
	t.Helper()
	s := testenv.NewPostgresSchema(t)
	if _, err := migrate.Up(context.Background(), pgxv5.New(s.Pool), ferry.Tables{Schema: s.Schema}, migrate.WithPartitionedOutbox(interval)); err != nil {
		t.Fatalf("migrate partitioned: %v", err)
	}
	return newHarnessOn(t, s)
}

// newHarnessOn is newHarness in a schema of the caller's choosing (e.g. on
// a throwaway cluster).
func newHarnessOn(t testing.TB, s *testenv.PostgresSchema) *harness {
	t.Helper()
	ctx := context.Background()
	tables := ferry.Tables{Schema: s.Schema}
	if _, err := migrate.Up(ctx, pgxv5.New(s.Pool), tables); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, note text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(pgxv5.New(s.Pool), outbox.WithTables(tables))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: s, tables: tables, w: w, slot: randName("ferry_t_"), pub: randName("ferry_t_")}
	// Registered after the schema's cleanup, so it runs before it (LIFO),
	// and before any relay cleanup registered later... runs after them.
	t.Cleanup(func() { h.dropSlotAndPublication() })
	return h
}

// dropSlotAndPublication removes what the relay created; the slot may still
// be marked active for a moment after its session ended.
func (h *harness) dropSlotAndPublication() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := h.s.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, h.slot)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			h.t.Errorf("drop slot %s: %v", h.slot, err)
			break
		}
		// Kill a leftover walsender (e.g. a SIGKILLed child's) and retry.
		_, _ = h.s.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, h.slot)
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`DROP PUBLICATION IF EXISTS %q`, h.pub)); err != nil {
		h.t.Errorf("drop publication %s: %v", h.pub, err)
	}
}

// event returns an event of aggregate agg (tenant "acme", type "order").
func event(agg string) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: "order.updated",
		SchemaVersion: 1, Payload: []byte(`{"n":1}`)}
}

// insert commits n events, one transaction each, round-robin over aggs
// aggregates, each transaction also touching the business table.
func (h *harness) insert(ctx context.Context, n, aggs int) []ferry.Event {
	h.t.Helper()
	var out []ferry.Event
	for i := range n {
		tx, err := h.s.Pool.Begin(ctx)
		if err != nil {
			h.t.Fatal(err)
		}
		id := uuid.NewString()
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, note) VALUES ($1, 'x')`, id); err != nil {
			h.t.Fatal(err)
		}
		evs, err := h.w.InsertTx(ctx, tx, event(fmt.Sprintf("o-%d", i%aggs)))
		if err != nil {
			h.t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, evs...)
	}
	return out
}

// relayOpts are fast settings for tests.
func (h *harness) relayOpts(extra ...cdc.Option) []cdc.Option {
	return append([]cdc.Option{
		cdc.WithTables(h.tables), cdc.WithSlotName(h.slot), cdc.WithPublicationName(h.pub),
		cdc.WithStandbyTimeout(100 * time.Millisecond), cdc.WithAcquireInterval(100 * time.Millisecond),
		cdc.WithMonitorInterval(100 * time.Millisecond), cdc.WithBackoff(20*time.Millisecond, 300*time.Millisecond),
		cdc.WithLogger(testLogger()),
	}, extra...)
}

func testLogger() *slog.Logger {
	if os.Getenv("FERRY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// start runs a relay until the returned stop is called (also at cleanup).
func (h *harness) start(pub broker.Publisher, extra ...cdc.Option) (*cdc.Relay, func()) {
	h.t.Helper()
	r, err := cdc.New(h.s.URL, pub, h.relayOpts(extra...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitForState(h.t, 20*time.Second, "relay active and caught up", func() bool {
		st := r.Status()
		return st.Role == cdc.RoleActive && !st.CatchingUp
	}, func() any { return r.Status() })
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("relay Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				h.t.Errorf("relay did not stop within 30s")
			}
		})
	}
	h.t.Cleanup(stop)
	return r, stop
}

// confirmed is the slot's confirmed position: 0 before the slot exists and
// while it is being created (confirmed_flush_lsn is NULL until then).
func (h *harness) confirmed(ctx context.Context) pglogrepl.LSN {
	h.t.Helper()
	var lsn pglogrepl.LSN
	err := h.s.Pool.QueryRow(ctx, `SELECT COALESCE(confirmed_flush_lsn, '0/0') FROM pg_replication_slots WHERE slot_name = $1`, h.slot).Scan(&lsn)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		h.t.Fatal(err)
	}
	return lsn
}

// childState describes a relay child that does not get on: whether its
// process still runs, the slot's row, and what the database's other
// sessions are doing or waiting for (statements, never row data: the
// producers' values are parameters).
func (h *harness) childState(ctx context.Context, cmd *exec.Cmd) string {
	var b strings.Builder
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	switch {
	case err != nil:
		fmt.Fprintf(&b, "child pid %d: %v", cmd.Process.Pid, err)
	default: // "pid (comm) S ...": Z once it exited and waits to be reaped
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		fmt.Fprintf(&b, "child pid %d state %s", cmd.Process.Pid, f[0])
	}
	var active bool
	var pid *int32
	var confirmed, restart *string
	if err := h.s.Pool.QueryRow(ctx, `SELECT active, active_pid, confirmed_flush_lsn::text, restart_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, h.slot).Scan(&active, &pid, &confirmed, &restart); err != nil {
		fmt.Fprintf(&b, "; slot: %v", err)
	} else {
		fmt.Fprintf(&b, "; slot active=%v pid=%v confirmed=%v restart=%v", active, deref(pid), deref(confirmed), deref(restart))
	}
	rows, err := h.s.Pool.Query(ctx, `SELECT pid, backend_type, COALESCE(state, ''), COALESCE(wait_event_type || ':' || wait_event, ''),
		COALESCE(pg_blocking_pids(pid)::text, ''), EXTRACT(EPOCH FROM now() - COALESCE(xact_start, backend_start))::int, left(query, 120)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND COALESCE(state, '') <> 'idle'`)
	if err != nil {
		fmt.Fprintf(&b, "; activity: %v", err)
		return b.String()
	}
	defer rows.Close()
	for rows.Next() {
		var apid, secs int32
		var typ, st, wait, blockers, query string
		if err := rows.Scan(&apid, &typ, &st, &wait, &blockers, &secs, &query); err != nil {
			fmt.Fprintf(&b, "; activity: %v", err)
			break
		}
		fmt.Fprintf(&b, "\n  pid %d %s %s wait=%s blocked_by=%s for %ds: %s", apid, typ, st, wait, blockers, secs, query)
	}
	return b.String()
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func (h *harness) currentWAL(ctx context.Context) pglogrepl.LSN {
	h.t.Helper()
	var lsn pglogrepl.LSN
	if err := h.s.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&lsn); err != nil {
		h.t.Fatal(err)
	}
	return lsn
}

func (h *harness) statusCounts(ctx context.Context) map[string]int {
	h.t.Helper()
	rows, err := h.s.Pool.Query(ctx, fmt.Sprintf(`SELECT status, count(*) FROM %s GROUP BY status`, h.tables.Name("outbox")))
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			h.t.Fatal(err)
		}
		m[s] = n
	}
	return m
}

// waitFor polls cond until it holds or timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitForState(t, timeout, what, cond, nil)
}

// waitForState is waitFor that reports state() on timeout.
func waitForState(t testing.TB, timeout time.Duration, what string, cond func() bool, state func() any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if state != nil {
				t.Fatalf("timed out after %v waiting for %s; state: %+v", timeout, what, state())
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---- Kafka (kfake) sink: counts every record, so every duplicate shows.

type kafkaSink struct {
	t       testing.TB
	cluster *kfake.Cluster
	seeds   []string
}

const testTopic = "order.events"

func startKafka(t testing.TB, opts ...kfake.Opt) *kafkaSink {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, testTopic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &kafkaSink{t: t, cluster: c, seeds: c.ListenAddrs()}
}

func (k *kafkaSink) publisher() *kafka.Publisher {
	k.t.Helper()
	p, err := kafka.NewPublisher(k.seeds, kafka.WithDeliveryTimeout(5*time.Second))
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { _ = p.Close() })
	return p
}

// record is one message at the broker.
type record struct {
	id     string
	key    string
	seq    int64
	offset int64
}

// read returns the records of the topic from the start, polling until
// done(records) holds and every record up to the partition's high-water
// mark has been read, or timeout. Stopping as soon as done held missed
// the tail: with duplicates, every id can be seen before the copies a
// receipt names (CI once flagged 3,221 receipts naming offsets the read
// had not reached).
func (k *kafkaSink) read(timeout time.Duration, done func([]record) bool) []record {
	k.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.seeds...), kgo.ConsumeTopics(testTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	var out []record
	var next, highWater int64 = 0, -1 // highWater -1: no fetch answered yet
	finished := func() bool {
		if !done(out) {
			return false
		}
		return len(out) == 0 || next >= highWater
	}
	deadline := time.Now().Add(timeout)
	for !finished() && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			highWater = max(highWater, p.HighWatermark)
		})
		fs.EachRecord(func(r *kgo.Record) {
			next = max(next, r.Offset+1)
			rec := record{key: string(r.Key), offset: r.Offset}
			for _, h := range r.Headers {
				switch h.Key {
				case "ce_id":
					rec.id = string(h.Value)
				case "ce_sequence":
					rec.seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				}
			}
			out = append(out, rec)
		})
	}
	return out
}

// verdict compares what the broker holds with what was committed.
type verdict struct {
	lost, phantom, duplicates, orderViolations int
	deliveries                                 map[string]int
}

func judge(committed []ferry.Event, got []record) verdict {
	v := verdict{deliveries: map[string]int{}}
	want := map[string]bool{}
	for _, e := range committed {
		want[e.ID.String()] = true
	}
	lastSeq := map[string]int64{}
	for _, r := range got {
		v.deliveries[r.id]++
		if !want[r.id] {
			v.phantom++
			continue
		}
		if v.deliveries[r.id] > 1 {
			v.duplicates++
			continue
		}
		// First delivery of each event: per aggregate, sequences rise.
		if r.seq <= lastSeq[r.key] {
			v.orderViolations++
		}
		lastSeq[r.key] = r.seq
	}
	for id := range want {
		if v.deliveries[id] == 0 {
			v.lost++
		}
	}
	return v
}

func allDelivered(committed []ferry.Event) func([]record) bool {
	return func(rs []record) bool {
		seen := map[string]bool{}
		for _, r := range rs {
			seen[r.id] = true
		}
		for _, e := range committed {
			if !seen[e.ID.String()] {
				return false
			}
		}
		return true
	}
}

// countingPublisher wraps a real publisher and counts publish attempts and
// acknowledgements per event id; it can also be switched to fail.
type countingPublisher struct {
	broker.Publisher
	mu    sync.Mutex
	acked map[uuid.UUID]int
	calls atomic.Int64
}

func newCounting(p broker.Publisher) *countingPublisher {
	return &countingPublisher{Publisher: p, acked: map[uuid.UUID]int{}}
}

func (c *countingPublisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	c.calls.Add(1)
	res := c.Publisher.Publish(ctx, events)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range res {
		if r.Err == nil {
			c.acked[events[i].ID]++
		}
	}
	return res
}

func (c *countingPublisher) ackedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.acked)
}

var _ broker.Publisher = (*countingPublisher)(nil)

// poolFor opens a plain pool (no search_path), closed at cleanup.
func poolFor(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
