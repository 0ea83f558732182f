package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// The embedded stack: SQLite and an in-process JetStream server, nothing
// to install. The producer writes events in its transaction; the relay
// publishes them and marks them sent; Notify wakes it at commit.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-relay-example-")
	defer os.RemoveAll(dir)

	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	store := sqlite.New(db)
	if _, err := migrate.Up(ctx, store, ferry.Tables{}); err != nil {
		fmt.Println(err)
		return
	}

	nats, _ := natsembed.Start(natsembed.WithStoreDir(filepath.Join(dir, "nats")))
	defer nats.Close()
	pub, _ := natsjs.DialPublisher(nats.ClientURL())
	defer pub.Close()
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}}); err != nil {
		fmt.Println(err)
		return
	}

	r, err := relay.New(store, pub, relay.WithShardCount(4), relay.WithLeaseTTL(2*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	w, _ := outbox.New(store, outbox.WithShardCount(4))
	for _, typ := range []string{"order.created", "order.paid", "order.shipped"} {
		_, _ = w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "42",
			EventType: typ, SchemaVersion: 1, Payload: []byte(`{}`)})
		r.Notify() // wake the relay now rather than at its next poll
	}

	stream, _ := pub.JetStream().Stream(ctx, "ORDERS")
	for i := 0; i < 200; i++ {
		if info, _ := stream.Info(ctx); info.State.Msgs == 3 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		fmt.Println(err)
	}

	cons, _ := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	msgs, _ := cons.Fetch(3, jetstream.FetchMaxWait(2*time.Second))
	for m := range msgs.Messages() {
		fmt.Println(m.Headers().Get("ce-type"), "seq", m.Headers().Get("ce-sequence"))
	}
	fmt.Println("published:", r.Status().Published)
	// Output:
	// order.created seq 1
	// order.paid seq 2
	// order.shipped seq 3
	// published: 3
}
