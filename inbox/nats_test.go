package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// natsStack is a real Postgres schema (through pgx) and a real JetStream
// server with a stream of its own for order events.
type natsStack struct {
	drv     *pgxv5.Driver
	url     string
	nc      *nats.Conn
	pub     *natsjs.Publisher
	stream  string
	subject string
}

// forEachNATS runs f on a fresh in-process server (the current release,
// from the Go module) and on the system server (FERRY_TEST_NATS_URL;
// Debian's 2.9.10 on the dev machine), so the inbox's JetStream path is
// checked on both. On a shared server each run uses its own stream.
func forEachNATS(t *testing.T, f func(t *testing.T, s *natsStack)) {
	t.Run("embedded", func(t *testing.T) { f(t, newNATSStack(t, "")) })
	t.Run("system", func(t *testing.T) { f(t, newNATSStack(t, testenv.NATSURL(t))) })
}

// newNATSStack connects to url, or starts an embedded server when url is "".
func newNATSStack(t testing.TB, url string, opts ...natsembed.Option) *natsStack {
	t.Helper()
	return newNATSStackMigrated(t, url, nil, opts...)
}

// newNATSStackMigrated is newNATSStack with the schema made by
// migrate.Up with mopts (a partitioned inbox).
func newNATSStackMigrated(t testing.TB, url string, mopts []migrate.Option, opts ...natsembed.Option) *natsStack {
	t.Helper()
	ctx := context.Background()
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}, mopts...); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant_id text NOT NULL,
		aggregate_id text NOT NULL, seq bigint NOT NULL, event_id text NOT NULL, payload text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if url == "" {
		emb, err := natsembed.Start(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = emb.Close() })
		url = emb.ClientURL()
	}
	nc, err := natsjs.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	t.Logf("NATS server %s at %s", nc.ConnectedServerVersion(), url)
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	s := &natsStack{drv: drv, url: url, nc: nc, pub: pub, stream: "INBOXTEST_" + suffix, subject: "inboxtest." + suffix + ".order.events"}
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: s.stream, Subjects: []string{s.subject}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.JetStream().DeleteStream(context.Background(), s.stream) })
	return s
}

func (s *natsStack) publish(t testing.TB, evs ...ferry.Event) {
	t.Helper()
	for _, ev := range evs { // one by one: the order of the test is the order of the stream
		ev.Topic = s.subject
		for _, r := range s.pub.Publish(context.Background(), []ferry.Event{ev}) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
}

func (s *natsStack) consumer(t testing.TB) *natsjs.Consumer {
	t.Helper()
	c, err := natsjs.DialConsumer(context.Background(), s.url, s.stream, "shipping", natsjs.WithAckWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// crashConsumer is a consumer on a connection of its own; kill closes
// that connection without Consumer.Close, as a killed process would:
// nothing is nacked and the consumer's keep-alive (InProgress) stops
// reaching the server, which redelivers after AckWait.
func (s *natsStack) crashConsumer(t testing.TB) (c *natsjs.Consumer, kill func()) {
	t.Helper()
	nc, err := natsjs.Connect(s.url)
	if err != nil {
		t.Fatal(err)
	}
	c, err = natsjs.NewConsumer(context.Background(), nc, s.stream, "shipping", natsjs.WithAckWait(time.Second))
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); nc.Close() })
	return c, nc.Close
}

func pgxEffect(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (tenant_id, aggregate_id, seq, event_id, payload) VALUES ($1, $2, $3, $4, $5)`,
		ev.TenantID, ev.AggregateID, ev.AggregateSeq, ev.ID.String(), string(ev.Payload))
	return err
}

func (s *natsStack) inbox(t testing.TB, opts ...Option) *Inbox[pgx.Tx] {
	t.Helper()
	opts = append([]Option{WithLogger(testLogger(t)), WithBackoff(10*time.Millisecond, 100*time.Millisecond)}, opts...)
	ib, err := New[pgx.Tx](s.drv, "shipping", pgxEffect, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

func (s *natsStack) effectSeqs(t *testing.T, eventID string) []int64 {
	t.Helper()
	q := `SELECT seq FROM effects ORDER BY id`
	args := []any{}
	if eventID != "" {
		q, args = `SELECT seq FROM effects WHERE event_id = $1 ORDER BY id`, []any{eventID}
	}
	rows, err := s.drv.Pool().Query(context.Background(), q, args...)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return seqs
}

// runUntil runs ib on a fresh consumer until cond holds (or 20s pass).
func (s *natsStack) runUntil(t *testing.T, ib *Inbox[pgx.Tx], cond func() bool) {
	t.Helper()
	c := s.consumer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, c) }()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("condition not reached; stats %+v", ib.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNATSCrashAfterCommitBeforeAck(t *testing.T) {
	forEachNATS(t, func(t *testing.T, s *natsStack) {
		ev := event(t, "acme", "o1", 1, `{"n":1}`)
		s.publish(t, ev)
		crash := errors.New("kill -9")
		faulty := s.inbox(t, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
		c, kill := s.crashConsumer(t)
		if err := faulty.Run(context.Background(), c); !errors.Is(err, ErrFault) {
			t.Fatalf("Run with fault: %v", err)
		}
		kill()
		if got := s.effectSeqs(t, ev.ID.String()); len(got) != 1 {
			t.Fatalf("after crash: effects %v, want the committed one", got)
		}
		// Restarted consumer: JetStream redelivers after AckWait; absorbed.
		restarted := s.inbox(t)
		s.runUntil(t, restarted, func() bool { return restarted.Stats().Duplicates == 1 })
		if got := s.effectSeqs(t, ev.ID.String()); len(got) != 1 {
			t.Fatalf("effects %v, want exactly 1", got)
		}
	})
}

func TestNATSCrashBeforeCommit(t *testing.T) {
	forEachNATS(t, func(t *testing.T, s *natsStack) {
		ev := event(t, "acme", "o1", 1, `{"n":1}`)
		s.publish(t, ev)
		faulty := s.inbox(t, WithFaults(Faults{BeforeCommit: func(ferry.Event) error { return errors.New("kill -9") }}))
		c, kill := s.crashConsumer(t)
		if err := faulty.Run(context.Background(), c); !errors.Is(err, ErrFault) {
			t.Fatalf("Run with fault: %v", err)
		}
		kill()
		if got := s.effectSeqs(t, ""); len(got) != 0 {
			t.Fatalf("rolled back transaction left effects %v", got)
		}
		restarted := s.inbox(t)
		s.runUntil(t, restarted, func() bool { return restarted.Stats().Applied == 1 })
		if got := s.effectSeqs(t, ev.ID.String()); len(got) != 1 {
			t.Fatalf("effects %v, want exactly 1", got)
		}
	})
}

func TestNATSOrder132(t *testing.T) {
	forEachNATS(t, func(t *testing.T, s *natsStack) {
		e1, e2, e3 := event(t, "acme", "o1", 1, "a"), event(t, "acme", "o1", 2, "b"), event(t, "acme", "o1", 3, "c")
		s.publish(t, e1, e3, e2)
		ib := s.inbox(t, WithBatch(16, 5*time.Millisecond))
		s.runUntil(t, ib, func() bool { return ib.Stats().Applied == 3 })
		if got := s.effectSeqs(t, ""); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
			t.Fatalf("effects %v, want [1 2 3]", got)
		}
		if st := ib.Stats(); st.Parked[ReasonGap] != 1 {
			t.Fatalf("stats %+v: event 3 should have been parked once", st)
		}
		if ps, _ := ib.ListParked(context.Background(), ParkedFilter{}); len(ps) != 0 {
			t.Fatalf("open parked: %+v", ps)
		}
	})
}

// The lag gauge reads JetStream's num_pending through the adapter while
// Run is running.
func TestNATSLagMetric(t *testing.T) {
	forEachNATS(t, func(t *testing.T, s *natsStack) {
		s.publish(t, event(t, "acme", "l1", 1, "a"), event(t, "acme", "l1", 2, "b"))
		release := make(chan struct{})
		blocking := func(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return pgxEffect(ctx, tx, ev)
		}
		reg := prometheus.NewRegistry()
		ib, err := New[pgx.Tx](s.drv, "shipping", blocking, WithRegisterer(reg), WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		c := s.consumer(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ib.Run(ctx, c) }()
		var lag float64 = -1
		for deadline := time.Now().Add(10 * time.Second); lag < 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "ferry_inbox_consumer_lag" {
					lag = mf.Metric[0].Gauge.GetValue()
				}
			}
		}
		close(release)
		for ib.Stats().Applied < 2 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if lag < 0 {
			t.Fatal("ferry_inbox_consumer_lag not exported while Run was running")
		}
	})
}
