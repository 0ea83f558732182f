package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/outboxstate"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// topicPrefix keeps test subjects apart from anything else on a server.
const topicPrefix = "relaytest"

// store is a migrated database with an outbox writer.
type store struct {
	db     DB
	pool   *pgxpool.Pool // Postgres only
	sqlDB  *sql.DB       // SQLite and MySQL
	schema string        // Postgres only
	url    string        // Postgres and MySQL
	shards int
	insert func(ctx context.Context, events ...ferry.Event) ([]ferry.Event, error)
	// pgInsertTx writes in a caller's pgx transaction (Postgres only).
	pgInsertTx func(ctx context.Context, tx pgx.Tx, events ...ferry.Event) ([]ferry.Event, error)
	// begin opens a producer transaction (Postgres and MySQL).
	begin func(ctx context.Context) (*producerTx, error)
	// watermark: relays on this store run WithSentWatermark, and the
	// helpers read a row's state through the watermark.
	watermark bool
	// pipeline: relays on this store run WithShardPipeline(pipeline)
	// when it is above 1.
	pipeline int
}

// newRelay is New on the store, in the store's state design.
func (s *store) newRelay(pub broker.Publisher, opts ...Option) (*Relay, error) {
	if s.watermark {
		opts = append(opts, WithSentWatermark())
	}
	if s.pipeline > 1 {
		opts = append(opts, WithShardPipeline(s.pipeline))
	}
	return New(s.db, pub, opts...)
}

// relayArgs are the `ferry relay` flags of the store's state design.
func (s *store) relayArgs() []string {
	if s.watermark {
		return []string{"--sent-watermark"}
	}
	if s.pipeline > 1 {
		return []string{"--shard-pipeline", fmt.Sprint(s.pipeline)}
	}
	return nil
}

// statusCol is the SQL of a row's status in the store's state design.
func (s *store) statusCol() string { return s.statusOf("ferry_outbox") }

// statusOf is statusCol for the outbox row aliased alias.
func (s *store) statusOf(alias string) string {
	if s.watermark {
		return outboxstate.Expr(ferry.Tables{}, alias)
	}
	return alias + ".status"
}

// producerTx is a caller's open transaction with an outbox writer on it.
type producerTx struct {
	insert   func(ctx context.Context, events ...ferry.Event) ([]ferry.Event, error)
	commit   func(ctx context.Context) error
	rollback func(ctx context.Context) error
}

// stores are the server stores the relay tests run on: the same test
// function on each.
// newStoreFunc makes a fresh, migrated store of one kind.
type newStoreFunc func(t testing.TB, shards int, extra ...outbox.Option) *store

// storeCase names a kind of store the relay tests run on.
type storeCase struct {
	name string
	new  newStoreFunc
}

// eachStore runs fn once per store kind, as parallel subtests. Every store
// is a fresh schema or database and every broker a fresh stream, server or
// queue, so the kinds do not share state; most of a relay test's time is
// waiting (lease expiry, broker retries, a destination created later), so
// running them side by side keeps the package well inside go test's
// default 10-minute limit on a loaded machine.
func eachStore(t *testing.T, stores []storeCase, fn func(t *testing.T, newStore newStoreFunc)) {
	t.Helper()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			fn(t, st.new)
		})
	}
}

var serverStores = []storeCase{
	{"postgres", newPGStore},
	{"postgres-partitioned", newPGPartitionedStore},
	{"postgres-watermark", newPGWatermarkStore},
	{"mysql", newMySQLStore},
}

func newMySQLStore(t testing.TB, shards int, extra ...outbox.Option) *store {
	t.Helper()
	d := testenv.NewMySQLDatabase(t)
	drv := mysql.New(d.DB)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	w, err := outbox.New(drv, writerOpts(shards, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := &store{db: drv, sqlDB: d.DB, url: d.URL, shards: shards, insert: w.Insert}
	s.begin = func(ctx context.Context) (*producerTx, error) {
		tx, err := d.DB.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return &producerTx{
			insert: func(ctx context.Context, events ...ferry.Event) ([]ferry.Event, error) {
				return w.InsertTx(ctx, tx, events...)
			},
			commit:   func(context.Context) error { return tx.Commit() },
			rollback: func(context.Context) error { return tx.Rollback() },
		}, nil
	}
	return s
}

// invariantStores are serverStores plus a store whose relays keep up to
// three batches of a shard in flight (WithShardPipeline(3)): the relay's
// invariants — crash between publish and mark, late commit, rollback,
// three relays and three relay processes with SIGKILL, fences, dead
// holds, outages, rebalancing, mark order — are proved on the pipeline
// too. The tests of destinations, brokers and budgets do not depend on it
// and run on serverStores.
var invariantStores = append(append([]storeCase{}, serverStores...), storeCase{"postgres-pipeline", newPGPipelineStore})

func writerOpts(shards int, extra ...outbox.Option) []outbox.Option {
	return append([]outbox.Option{outbox.WithShardCount(shards),
		outbox.WithTopicTemplate(topicPrefix + ".{aggregate_type}")}, extra...)
}

func newPGStore(t testing.TB, shards int, extra ...outbox.Option) *store {
	t.Helper()
	return newPGStoreMigrated(t, shards, nil, extra...)
}

// newPGWatermarkStore is newPGStore whose relays keep their state out of
// the event row (WithSentWatermark).
func newPGWatermarkStore(t testing.TB, shards int, extra ...outbox.Option) *store {
	t.Helper()
	s := newPGStoreMigrated(t, shards, nil, extra...)
	s.watermark = true
	return s
}

// newPGPartitionedStore is newPGStore with the outbox partitioned by
// created_at (migrate.WithPartitionedOutbox), in hourly partitions.
func newPGPartitionedStore(t testing.TB, shards int, extra ...outbox.Option) *store {
	t.Helper()
	s := newPGStoreMigrated(t, shards, []migrate.Option{migrate.WithPartitionedOutbox(time.Hour)}, extra...)
	parts, err := partition.List(context.Background(), s.db.Executor(), ferry.Tables{}, partition.Outbox)
	if err != nil || len(parts) < partition.DefaultAhead {
		t.Fatalf("partitioned outbox: %d partitions, %v", len(parts), err)
	}
	return s
}

func newPGStoreMigrated(t testing.TB, shards int, mopts []migrate.Option, extra ...outbox.Option) *store {
	t.Helper()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}, mopts...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	w, err := outbox.New(drv, writerOpts(shards, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	st := &store{db: drv, pool: s.Pool, schema: s.Schema, url: s.URL, shards: shards, insert: w.Insert, pgInsertTx: w.InsertTx}
	st.begin = func(ctx context.Context) (*producerTx, error) {
		tx, err := s.Pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &producerTx{
			insert: func(ctx context.Context, events ...ferry.Event) ([]ferry.Event, error) {
				return w.InsertTx(ctx, tx, events...)
			},
			commit: tx.Commit, rollback: tx.Rollback,
		}, nil
	}
	return st
}

func newSQLiteStore(t testing.TB, shards int) *store {
	t.Helper()
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	w, err := outbox.New(drv, writerOpts(shards)...)
	if err != nil {
		t.Fatal(err)
	}
	return &store{db: drv, sqlDB: db, shards: shards, insert: w.Insert}
}

// ev builds an event of aggregate agg (type "order" unless given).
func ev(agg string, payload string) ferry.Event {
	return ferry.Event{TenantID: "t1", AggregateType: "order", AggregateID: agg, EventType: "order.changed",
		SchemaVersion: 1, Payload: []byte(`{"v":"` + payload + `"}`)}
}

// produce writes n events spread round-robin over aggs aggregates, in
// transactions of up to 50 events, and returns them as written.
func (s *store) produce(t testing.TB, n, aggs int) []ferry.Event {
	t.Helper()
	ctx := context.Background()
	var out []ferry.Event
	for i := 0; i < n; {
		var batch []ferry.Event
		for j := 0; j < 50 && i < n; j, i = j+1, i+1 {
			batch = append(batch, ev(fmt.Sprintf("agg-%03d", i%aggs), fmt.Sprint(i)))
		}
		got, err := s.insert(ctx, batch...)
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
		out = append(out, got...)
	}
	return out
}

// rowStatus is one outbox row's relay state.
type rowStatus struct {
	status, lastError, receipt string
	attempts                   int
}

func (s *store) rows(t testing.TB) map[string]rowStatus {
	t.Helper()
	rows, err := s.db.Executor().Query(context.Background(),
		strings.Replace(`SELECT CAST(event_id AS TEXT), `+s.statusCol()+`, last_error, broker_receipt, attempts FROM ferry_outbox`,
			"TEXT", map[bool]string{true: "CHAR", false: "TEXT"}[s.db.Dialect() == driver.MySQL], 1))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]rowStatus{}
	for rows.Next() {
		var id string
		var r rowStatus
		if err := rows.Scan(&id, &r.status, &r.lastError, &r.receipt, &r.attempts); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *store) count(t testing.TB, status string) int {
	t.Helper()
	return int(s.scalar(t, `SELECT count(*) FROM ferry_outbox WHERE `+s.statusCol()+` = $1`, status))
}

// scalar runs a query returning one integer (0 when it returns no row).
func (s *store) scalar(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	rows, err := s.db.Executor().Query(context.Background(), q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// natsEnv is a JetStream server (embedded or the system one) with a
// stream capturing the test subjects.
type natsEnv struct {
	url      string
	stream   string
	subjects []string
	emb      *natsembed.Server
}

func startEmbeddedNATS(t testing.TB, opts ...natsembed.Option) *natsEnv {
	t.Helper()
	opts = append([]natsembed.Option{natsembed.WithStoreDir(t.TempDir())}, opts...)
	e, err := natsembed.Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	n := &natsEnv{url: e.ClientURL(), stream: "RELAYTEST", subjects: []string{topicPrefix + ".>"}, emb: e}
	n.ensureStream(t)
	return n
}

// systemNATS uses the machine's NATS server with a stream of a unique
// name and subject prefix, deleted at cleanup.
func systemNATS(t testing.TB) (*natsEnv, string) {
	t.Helper()
	url := testenv.NATSURL(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	prefix := topicPrefix + suffix
	n := &natsEnv{url: url, stream: "RELAYTEST_" + suffix, subjects: []string{prefix + ".>"}}
	n.ensureStream(t)
	t.Cleanup(func() {
		nc, err := nats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, n.stream)
	})
	return n, prefix
}

func (n *natsEnv) ensureStream(t testing.TB) {
	t.Helper()
	nc, err := natsjs.Connect(n.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: n.stream, Subjects: n.subjects}); err != nil {
		t.Fatal(err)
	}
}

func (n *natsEnv) publisher(t testing.TB) *natsjs.Publisher {
	t.Helper()
	p, err := natsjs.DialPublisher(n.url, natsjs.WithAckTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// streamMsg is one stored message, decoded.
type streamMsg struct {
	seq    uint64
	ev     ferry.Event
	stored time.Time // the server's store time
}

// read returns every message in the stream, in stream order.
func (n *natsEnv) read(t testing.TB) []streamMsg {
	t.Helper()
	nc, err := nats.Connect(n.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, n.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := info.State.Msgs
	if total == 0 {
		return nil
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []streamMsg
	for uint64(len(out)) < total {
		batch, err := c.Fetch(int(min(total-uint64(len(out)), 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			h := map[string]string{}
			for k, v := range m.Headers() {
				if len(v) > 0 {
					h[k] = v[0]
				}
			}
			e, err := cloudevents.Decode(cloudevents.NATS, h, m.Data())
			if err != nil {
				t.Fatalf("decode stored message: %v", err)
			}
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, streamMsg{seq: md.Sequence.Stream, ev: e, stored: md.Timestamp})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Fatal(err)
		}
		if got == 0 {
			t.Fatalf("stream %s: read %d of %d messages, then nothing", n.stream, len(out), total)
		}
	}
	return out
}

// checkBroker asserts that the stream holds every event of want exactly
// once (no loss, no duplicate stored), no event not in want (no phantom),
// and per aggregate in sequence order. It returns the ids of the events
// of want the broker does not hold, for a caller to explain.
func checkBroker(t testing.TB, msgs []streamMsg, want []ferry.Event) (lostIDs []string) {
	t.Helper()
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[e.ID.String()] = true
	}
	seen := map[string]int{}
	last := map[string]int64{}
	for _, m := range msgs {
		id := m.ev.ID.String()
		if !wantIDs[id] {
			t.Errorf("phantom: broker holds event %s that was not committed", id)
		}
		seen[id]++
		k := ferry.AggregateKey(m.ev.TenantID, m.ev.AggregateType, m.ev.AggregateID)
		if m.ev.AggregateSeq <= last[k] {
			t.Errorf("order: aggregate %s seq %d stored after seq %d (stream seq %d)", k, m.ev.AggregateSeq, last[k], m.seq)
		}
		last[k] = m.ev.AggregateSeq
	}
	lost, dup := 0, 0
	for id := range wantIDs {
		switch seen[id] {
		case 0:
			lost++
			lostIDs = append(lostIDs, id)
		case 1:
		default:
			dup++
		}
	}
	if lost > 0 || dup > 0 {
		t.Errorf("broker holds %d messages for %d events: %d lost, %d stored twice", len(msgs), len(want), lost, dup)
	}
	slices.Sort(lostIDs)
	return lostIDs
}

// runRelay starts r.Run in a goroutine; the returned stop cancels it and
// returns Run's error.
func runRelay(t testing.TB, r *Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("relay did not stop within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countingPublisher wraps a real publisher and counts calls: tests assert
// bounded broker traffic with it.
type countingPublisher struct {
	broker.Publisher
	mu       sync.Mutex
	publish  int
	pings    int
	failWith func(i int, e *ferry.Event) error // optional: replace a result with this error
	// delay (optional) holds each call before it publishes, so that
	// batches overlap; active/maxActive count calls in progress and
	// perEvent the publishes of each event id (when non-nil).
	delay             time.Duration
	jitter            bool // each call waits a random part of delay instead
	active, maxActive int
	perEvent          map[string]int
}

// failEveryFourthOnce is a countingPublisher.failWith that fails the
// events of sequence 2, 6, 10, … of every aggregate once, as an ack
// timeout (row failures: the broker itself stays up).
func failEveryFourthOnce() func(i int, e *ferry.Event) error {
	var mu sync.Mutex
	failed := map[string]bool{}
	return func(i int, e *ferry.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if e.AggregateSeq%4 == 2 && !failed[e.ID.String()] {
			failed[e.ID.String()] = true
			return broker.NewError(broker.ClassIndeterminate, errors.New("ack timeout (injected)"))
		}
		return nil
	}
}

func (c *countingPublisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	c.mu.Lock()
	c.publish++
	f := c.failWith
	c.active++
	c.maxActive = max(c.maxActive, c.active)
	if c.perEvent != nil {
		for i := range events {
			c.perEvent[events[i].ID.String()]++
		}
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.active--
		c.mu.Unlock()
	}()
	if d := c.delay; d > 0 {
		if c.jitter {
			d = time.Duration(rand.Int64N(int64(d)))
		}
		time.Sleep(d)
	}
	res := c.Publisher.Publish(ctx, events)
	if f != nil {
		for i := range events {
			if err := f(i, &events[i]); err != nil {
				res[i] = broker.Result{Err: err}
			}
		}
	}
	return res
}

func (c *countingPublisher) Ping(ctx context.Context) error {
	c.mu.Lock()
	c.pings++
	c.mu.Unlock()
	return c.Publisher.Ping(ctx)
}

func (c *countingPublisher) calls() (publish, pings int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publish, c.pings
}

// gauge reads a gauge's or counter's current value.
func gauge(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	return 0
}

// fastOpts are relay options for tests: short lease and poll.
func fastOpts(shards int, extra ...Option) []Option {
	return append([]Option{WithShardCount(shards), WithLeaseTTL(1500 * time.Millisecond),
		WithPollInterval(50 * time.Millisecond), WithBackoff(20*time.Millisecond, 200*time.Millisecond),
		WithProbe(50*time.Millisecond, 500*time.Millisecond), WithPublishTimeout(5 * time.Second)}, extra...)
}

// writer returns an insert function with topic template tmpl.
func (s *store) writer(t testing.TB, tmpl ferry.TopicTemplate) func(context.Context, ...ferry.Event) ([]ferry.Event, error) {
	t.Helper()
	return s.writerWith(t, tmpl)
}

// writerWith is writer with extra writer options (e.g. WithNotify).
func (s *store) writerWith(t testing.TB, tmpl ferry.TopicTemplate, extra ...outbox.Option) func(context.Context, ...ferry.Event) ([]ferry.Event, error) {
	t.Helper()
	opts := append([]outbox.Option{outbox.WithShardCount(s.shards), outbox.WithTopicTemplate(tmpl)}, extra...)
	if s.pool != nil {
		w, err := outbox.New(pgxv5.New(s.pool), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return w.Insert
	}
	if s.db.Dialect() == driver.MySQL {
		w, err := outbox.New(mysql.New(s.sqlDB), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return w.Insert
	}
	w, err := outbox.New(sqlite.New(s.sqlDB), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w.Insert
}
