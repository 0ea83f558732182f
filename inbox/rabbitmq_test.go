package inbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// RabbitMQ (the local server, quorum queue, manual acks) into Postgres
// through database/sql: order 1,3,2 with a duplicate publish, then a crash
// after the commit and before the ack — the requeued message is absorbed.
func TestRabbitMQToPostgres(t *testing.T) {
	for _, c := range []struct {
		name string
		mk   func(*testing.T) store
	}{{"postgres", postgresStore}, {"mysql", mysqlStore}} {
		t.Run(c.name, func(t *testing.T) { testRabbitMQInbox(t, c.mk) })
	}
}

// testRabbitMQInbox is TestRabbitMQToPostgres on the store mk makes (the
// same scenario on MariaDB).
func testRabbitMQInbox(t *testing.T, mk func(*testing.T) store) {
	url := testenv.RabbitMQURL(t)
	st := mk(t)
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	top := rabbitmq.Topology{Exchange: "ferry-inbox-test-" + hex.EncodeToString(b), Queue: "ferry-inbox-test-q-" + hex.EncodeToString(b)}
	ctx := context.Background()
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), url, top) })
	pub, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange(top.Exchange))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	publish := func(evs ...ferry.Event) {
		for _, ev := range evs {
			for _, r := range pub.Publish(ctx, []ferry.Event{ev}) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		}
	}
	consumer := func() *rabbitmq.Consumer {
		c, err := rabbitmq.NewConsumer(url, top.Queue, rabbitmq.WithPrefetch(64))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	runUntil := func(ib *Inbox[*sql.Tx], cond func() bool) {
		t.Helper()
		c := consumer()
		defer c.Close()
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- ib.Run(runCtx, c) }()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				cancel()
				<-done
				t.Fatalf("condition not reached: stats %+v", ib.Stats())
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	e1, e2, e3 := event(t, "acme", "r1", 1, "a"), event(t, "acme", "r1", 2, "b"), event(t, "acme", "r1", 3, "c")
	publish(e1, e3, e2, e1)
	ib := newInbox(t, st, nil)
	runUntil(ib, func() bool { st := ib.Stats(); return st.Applied == 3 && st.Duplicates == 1 })
	if got := seqs(effects(t, st.db)); got != "1,2,3" {
		t.Fatalf("effects %s, want 1,2,3", got)
	}

	e4 := event(t, "acme", "r1", 4, "d")
	publish(e4)
	faulty := newInbox(t, st, nil, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return errors.New("kill -9") }}))
	c := consumer()
	if err := faulty.Run(ctx, c); !errors.Is(err, ErrFault) {
		t.Fatalf("Run with fault: %v", err)
	}
	_ = c.Close() // the unacked message goes back to the queue
	restarted := newInbox(t, st, nil)
	runUntil(restarted, func() bool { return restarted.Stats().Duplicates == 1 })
	if n := st.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, e4.ID.String()); n != 1 {
		t.Fatalf("effects of event 4 = %d, want 1", n)
	}
}
