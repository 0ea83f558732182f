package inbox_test

import (
	"context"
	"database/sql"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/inbox"
)

// parkOne publishes one order event to an embedded JetStream server and
// runs ib until it has parked it.
func parkOne(ctx context.Context, ib *inbox.Inbox[*sql.Tx]) {
	nats, _ := natsembed.Start()
	defer nats.Close()
	nc, _ := natsjs.Connect(nats.ClientURL())
	defer nc.Close()
	pub, _ := natsjs.NewPublisher(nc)
	defer pub.Close()
	_, _ = natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}})
	pub.Publish(ctx, []ferry.Event{orderEvent(1)})
	consumer, _ := natsjs.DialConsumer(ctx, nats.ClientURL(), "ORDERS", "shipping")
	defer consumer.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- ib.Run(runCtx, consumer) }()
	for deadline := time.Now().Add(10 * time.Second); len(ib.Stats().Parked) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
}
