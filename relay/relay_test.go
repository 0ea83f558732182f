package relay

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func TestMain(m *testing.M) {
	testenv.Announce("relay", testenv.Postgres, testenv.MySQL, testenv.NATS, testenv.RabbitMQ)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// TestPublishesAndMarks is the basic cycle on Postgres and SQLite: every
// committed event reaches the broker once, in order, and its row is
// marked sent with the broker's receipt.
func TestPublishesAndMarks(t *testing.T) {
	for _, name := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			var s *store
			switch name {
			case "postgres":
				s = newPGStore(t, 4)
			case "mysql":
				s = newMySQLStore(t, 4)
			default:
				s = newSQLiteStore(t, 4)
			}
			n := startEmbeddedNATS(t)
			want := s.produce(t, 300, 7)
			reg := prometheus.NewRegistry()
			r, err := s.newRelay(n.publisher(t), fastOpts(4, WithRegisterer(reg), WithBatchSize(64))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, r)
			waitFor(t, 30*time.Second, "all rows sent", func() bool { return s.count(t, "sent") == len(want) })
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			checkBroker(t, n.read(t), want)
			for id, row := range s.rows(t) {
				if !strings.Contains(row.receipt, `"broker":"nats"`) || !strings.Contains(row.receipt, `"destination":"RELAYTEST"`) {
					t.Fatalf("row %s: receipt %q lacks the broker's stream", id, row.receipt)
				}
			}
			if got := gauge(r.m.published); got != float64(len(want)) {
				t.Errorf("ferry_relay_published_total = %v, want %d", got, len(want))
			}
			if st := r.Status(); st.Running || len(st.OwnedShards) != 0 {
				t.Errorf("after Run returned: %+v", st)
			}
			// Graceful shutdown released the leases: nobody owns a shard.
			rows, err := s.db.Executor().Query(context.Background(), `SELECT count(*) FROM ferry_relay_leases WHERE owner <> ''`)
			if err != nil {
				t.Fatal(err)
			}
			var owned int64
			for rows.Next() {
				_ = rows.Scan(&owned)
			}
			rows.Close()
			if owned != 0 {
				t.Errorf("%d leases still owned after graceful shutdown", owned)
			}
		})
	}
}

// TestLateCommitIsPublished: a transaction holding a lower id commits
// after higher ids were published. Claiming by status (not "id > last
// seen") publishes it anyway.
func TestLateCommitIsPublished(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testLateCommitIsPublished(t, newStore(t, 1)) })
}

func testLateCommitIsPublished(t *testing.T, s *store) {
	n, tx, late := startLateCommit(t, s, nil)
	ctx := context.Background()
	early := s.produce(t, 20, 3) // higher ids, committed first
	if s.watermark {
		// The watermark design publishes them, but its watermark waits
		// for the open transaction: the table says "not sent yet".
		waitFor(t, 20*time.Second, "the early rows on the broker", func() bool { return len(n.read(t)) == 20 })
		time.Sleep(300 * time.Millisecond) // several poll cycles
		if got := s.count(t, "sent"); got != 0 {
			t.Fatalf("%d rows read as sent while a transaction that may hold a lower id is open, want 0", got)
		}
		if got := len(n.read(t)); got != 20 {
			t.Fatalf("broker holds %d messages while the watermark waits, want 20 (republished?)", got)
		}
	} else {
		waitFor(t, 20*time.Second, "the early rows sent", func() bool { return s.count(t, "sent") == 20 })
	}
	if got := len(n.read(t)); got != 20 {
		t.Fatalf("broker holds %d messages before the late commit, want 20", got)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the late row sent", func() bool { return s.count(t, "sent") == 21 })
	checkBroker(t, n.read(t), append(early, late...))
}

// startLateCommit opens a producer transaction that takes its id first
// and stays open, then starts a relay on s (adjusted by tweak, a test
// hook, when not nil) publishing to an embedded NATS.
func startLateCommit(t *testing.T, s *store, tweak func(*Relay)) (*natsEnv, *producerTx, []ferry.Event) {
	t.Helper()
	n := startEmbeddedNATS(t)
	ctx := context.Background()
	tx, err := s.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.rollback(ctx) })
	late, err := tx.insert(ctx, ev("late", "x"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.newRelay(n.publisher(t), fastOpts(1)...)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(r)
	}
	runRelay(t, r)
	return n, tx, late
}

// TestRollbackPublishesNothing: G1 end to end. A rolled-back producer
// transaction's event never reaches the broker.
func TestRollbackPublishesNothing(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testRollbackPublishesNothing(t, newStore(t, 2)) })
}

func testRollbackPublishesNothing(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	ctx := context.Background()
	r, err := s.newRelay(n.publisher(t), fastOpts(2)...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	var committed []ferry.Event
	var rolledBack []ferry.Event
	for i := 0; i < 20; i++ {
		tx, err := s.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tx.insert(ctx, ev("acct-"+string(rune('a'+i%4)), "x"))
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if err := tx.rollback(ctx); err != nil {
				t.Fatal(err)
			}
			rolledBack = append(rolledBack, got...)
			continue
		}
		if err := tx.commit(ctx); err != nil {
			t.Fatal(err)
		}
		committed = append(committed, got...)
	}
	waitFor(t, 20*time.Second, "committed rows sent", func() bool { return s.count(t, "sent") == len(committed) })
	time.Sleep(300 * time.Millisecond) // several more poll cycles
	msgs := n.read(t)
	checkBroker(t, msgs, committed) // includes "no phantom"
	for _, m := range msgs {
		for _, rb := range rolledBack {
			if m.ev.ID == rb.ID {
				t.Fatalf("rolled-back event %s was published", rb.ID)
			}
		}
	}
	if len(rolledBack) == 0 {
		t.Fatal("test wrote no rolled-back event")
	}
}

// TestCrashBetweenPublishAndMark: the relay "crashes" after the broker
// acked and before marking. After restart the same event ids are
// published again (never new ids); JetStream recognises them as
// duplicates, so nothing is lost and nothing is stored twice.
func TestCrashBetweenPublishAndMark(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testCrashBetweenPublishAndMark(t, newStore(t, 2)) })
}

func testCrashBetweenPublishAndMark(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	want := s.produce(t, 40, 5)
	pub := n.publisher(t)

	var crashMu sync.Mutex
	var crashed []ferry.Event
	crashAt := func(_ context.Context, events []ferry.Event, res []broker.Result) error {
		for _, r := range res {
			if r.Err != nil {
				return nil // let errors through; crash on a clean batch
			}
		}
		crashMu.Lock()
		defer crashMu.Unlock()
		if crashed != nil {
			return nil // another worker's batch: only the first one "crashes"
		}
		crashed = append([]ferry.Event(nil), events...)
		return errors.New("simulated crash")
	}
	r1, err := s.newRelay(pub, fastOpts(2, WithInstanceID("relay-a"), WithBatchSize(10),
		WithFaults(Faults{AfterPublishBeforeMark: crashAt}))...)
	if err != nil {
		t.Fatal(err)
	}
	err = r1.Run(context.Background())
	if !errors.Is(err, ErrFaultInjected) {
		t.Fatalf("Run = %v, want ErrFaultInjected", err)
	}
	if len(crashed) == 0 {
		t.Fatal("the fault hook never fired")
	}
	if got := s.count(t, "sent"); got != 0 {
		t.Fatalf("%d rows marked sent although the relay crashed before marking", got)
	}
	before := n.read(t)
	// With the shard pipeline, other batches may have been published
	// (and left unmarked) beside the crashed one.
	if len(before) != len(crashed) && (s.pipeline <= 1 || len(before) < len(crashed)) {
		t.Fatalf("broker holds %d messages after the crash, want the %d of the crashed batch", len(before), len(crashed))
	}

	// Restart under the same id: it adopts its leases at once (fence+1).
	r2, err := s.newRelay(pub, fastOpts(2, WithInstanceID("relay-a"), WithBatchSize(10))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r2)
	waitFor(t, 20*time.Second, "all rows sent", func() bool { return s.count(t, "sent") == len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkBroker(t, n.read(t), want) // no loss, stored once, in order, no new id
	if got := r2.Status().Duplicates; got != uint64(len(before)) {
		t.Errorf("duplicates counted after restart = %d, want %d (what was published before the crash, republished under the same ids)", got, len(before))
	}
	rows := s.rows(t)
	for _, m := range before {
		e := m.ev
		if s.watermark {
			break // acked rows are not written: no per-row receipt (Duplicates above counts them)
		}
		if !strings.Contains(rows[e.ID.String()].receipt, `"duplicate":true`) {
			t.Errorf("event %s republished after the crash: receipt %q does not say duplicate", e.ID, rows[e.ID.String()].receipt)
		}
	}
}

// TestShardCountMismatch: rows written with another N stop the relay at
// start with both numbers in the error.
func TestShardCountMismatch(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) { testShardCountMismatch(t, newStore) })
}

func testShardCountMismatch(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, 8)
	s.produce(t, 3, 3)
	n := startEmbeddedNATS(t)
	r, err := s.newRelay(n.publisher(t), fastOpts(16)...)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(context.Background())
	var sce *ShardCountError
	if !errors.Is(err, ErrShardCountMismatch) || !errors.As(err, &sce) {
		t.Fatalf("Run = %v, want ErrShardCountMismatch", err)
	}
	if sce.Configured != 16 || sce.Found != 8 || sce.Rows != 3 || !strings.Contains(err.Error(), "16") || !strings.Contains(err.Error(), "8") {
		t.Fatalf("error %q / %+v does not name both counts", err, sce)
	}

	// A live relay with another N stops a new one at start, too.
	s2 := newStore(t, 4)
	a, err := s2.newRelay(n.publisher(t), fastOpts(4)...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, a)
	waitFor(t, 10*time.Second, "relay a running", func() bool { return len(a.Status().OwnedShards) == 4 })
	b, err := s2.newRelay(n.publisher(t), fastOpts(8)...)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Run(context.Background())
	if !errors.As(err, &sce) || sce.Configured != 8 || sce.Found != 4 || sce.Rows != 0 || !strings.Contains(err.Error(), "a live relay uses 4") {
		t.Fatalf("Run beside a live relay with 4 shards = %v, want a ShardCountError naming 8 and 4", err)
	}
}

func TestConfigValidation(t *testing.T) {
	s := newSQLiteStore(t, 1)
	pub := &countingPublisher{}
	cases := []struct {
		field string
		opt   Option
	}{
		{"shard_count", WithShardCount(0)},
		{"shard_count", WithShardCount(ferry.MaxShardCount + 1)},
		{"batch_size", WithBatchSize(0)},
		{"batch_size", WithBatchSize(MaxBatchSize + 1)},
		{"poll_interval", WithPollInterval(time.Millisecond)},
		{"lease_ttl", WithLeaseTTL(10 * time.Millisecond)},
		{"backoff", WithBackoff(time.Second, time.Millisecond)},
		{"max_attempts", WithMaxAttempts(0)},
		{"dead_policy", WithDeadPolicy("drop")},
		{"listener", WithListener(nil, "x")},
		{"tables.prefix", WithTables(ferry.Tables{Prefix: "bad-prefix"})},
	}
	for _, c := range cases {
		_, err := s.newRelay(pub, c.opt)
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: New = %v, want a ConfigError naming %s", c.field, err, c.field)
		}
	}
	if _, err := New(nil, pub); err == nil {
		t.Error("New(nil db) succeeded")
	}
	if _, err := s.newRelay(nil); err == nil {
		t.Error("New(nil publisher) succeeded")
	}
}

// TestCustomTables: a schema and prefix other than the defaults reach
// every statement (claim, marks, leases, instances, the discarded_at
// probe), so nothing silently reads the default tables.
func TestCustomTables(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		ps := testenv.NewPostgresSchema(t)
		tables := ferry.Tables{Schema: ps.Schema + "_app", Prefix: "app_"}
		t.Cleanup(func() { _, _ = ps.Pool.Exec(context.Background(), `DROP SCHEMA "`+tables.Schema+`" CASCADE`) })
		drv := pgxv5.New(ps.Pool)
		if _, err := migrate.Up(context.Background(), drv, tables); err != nil {
			t.Fatal(err)
		}
		w, err := outbox.New(drv, outbox.WithTables(tables), outbox.WithShardCount(2), outbox.WithTopicTemplate(topicPrefix+".{aggregate_type}"))
		if err != nil {
			t.Fatal(err)
		}
		testCustomTables(t, drv, tables, w.Insert)
	})
	t.Run("mysql", func(t *testing.T) {
		// On MySQL the schema is a database on the same server.
		d := testenv.NewMySQLDatabase(t)
		tables := ferry.Tables{Schema: d.Name + "_app", Prefix: "app_"}
		if _, err := d.DB.Exec("CREATE DATABASE `" + tables.Schema + "`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE `" + tables.Schema + "`") })
		drv := mysql.New(d.DB)
		if _, err := migrate.Up(context.Background(), drv, tables); err != nil {
			t.Fatal(err)
		}
		w, err := outbox.New(drv, outbox.WithTables(tables), outbox.WithShardCount(2), outbox.WithTopicTemplate(topicPrefix+".{aggregate_type}"))
		if err != nil {
			t.Fatal(err)
		}
		testCustomTables(t, drv, tables, w.Insert)
	})
}

func testCustomTables(t *testing.T, drv DB, tables ferry.Tables, w func(context.Context, ...ferry.Event) ([]ferry.Event, error)) {
	ctx := context.Background()
	var want []ferry.Event
	for i := 0; i < 20; i++ {
		got, err := w(ctx, ev(fmt.Sprint("c", i%3), "x"))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, got...)
	}
	n := startEmbeddedNATS(t)
	r, err := New(drv, n.publisher(t), fastOpts(2, WithTables(tables))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	waitFor(t, 20*time.Second, "all sent", func() bool { return r.Status().Published == uint64(len(want)) })
	var sent int64
	if _, err := driver.QueryRow(ctx, drv.Executor(), `SELECT count(*) FROM `+tables.Name("outbox")+` WHERE status = 'sent'`, nil, &sent); err != nil {
		t.Fatal(err)
	}
	if int(sent) != len(want) {
		t.Fatalf("%d rows sent in the custom table, want %d", sent, len(want))
	}
	checkBroker(t, n.read(t), want)
}
