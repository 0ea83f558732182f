package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migrate"
)

// A shipping service consumes order events from an embedded JetStream
// server into SQLite. The handler's write, the inbox claim and the cursor
// commit together; events 1, 3, 2 arrive in that order and are applied
// 1, 2, 3.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "shipping.db"))
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		log.Fatal(err)
	}
	_, _ = db.Exec(`CREATE TABLE shipments (order_id TEXT, seq INTEGER)`)

	// The broker: an in-process JetStream server, a stream, three events.
	nats, _ := natsembed.Start()
	defer nats.Close()
	nc, _ := natsjs.Connect(nats.ClientURL())
	defer nc.Close()
	pub, _ := natsjs.NewPublisher(nc)
	defer pub.Close()
	_, _ = natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}})
	for _, seq := range []int64{1, 3, 2} {
		pub.Publish(ctx, []ferry.Event{orderEvent(seq)})
	}

	// The consumer.
	ib, err := inbox.New[*sql.Tx](drv, "shipping",
		func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO shipments VALUES ($1, $2)`, ev.AggregateID, ev.AggregateSeq)
			return err
		},
		inbox.WithSchemas(inbox.SchemaKey{EventType: "order.paid", SchemaVersion: 1}),
		inbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	)
	if err != nil {
		log.Fatal(err)
	}
	consumer, _ := natsjs.DialConsumer(ctx, nats.ClientURL(), "ORDERS", "shipping")
	defer consumer.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- ib.Run(runCtx, consumer) }()
	for deadline := time.Now().Add(10 * time.Second); ib.Stats().Applied < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done

	rows, _ := db.Query(`SELECT seq FROM shipments ORDER BY rowid`)
	defer rows.Close()
	var seqs []int
	for rows.Next() {
		var seq int
		_ = rows.Scan(&seq)
		seqs = append(seqs, seq)
	}
	fmt.Println(seqs)
	st := ib.Stats()
	fmt.Printf("applied %d, parked as gap on the way %d\n", st.Applied, st.Parked[inbox.ReasonGap])
	// Output:
	// [1 2 3]
	// applied 3, parked as gap on the way 1
}

func orderEvent(seq int64) ferry.Event {
	id, _ := ferry.NewEventID()
	return ferry.Event{ID: id, TenantID: "acme", AggregateType: "order", AggregateID: "42", AggregateSeq: seq,
		EventType: "order.paid", SchemaVersion: 1, ContentType: "application/json", Payload: []byte(`{}`),
		OccurredAt: time.Now().UTC(), Topic: "order.events"}
}

// An operator lists what a consumer parked and replays it after the fix:
// the replay goes through every check again (schema, authorization, dedup,
// cursor), never around the inbox.
func ExampleInbox_Replay() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "shipping.db"))
	defer db.Close()
	drv := sqlite.New(db)
	_, _ = migrate.Up(ctx, drv, ferry.Tables{})

	// An event parked earlier because its schema version was not supported
	// yet (here written through a consumer that only knows v2).
	quiet := inbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	noop := func(context.Context, *sql.Tx, ferry.Event) error { return nil }
	old, _ := inbox.New[*sql.Tx](drv, "shipping", noop, quiet, inbox.WithSchemas(inbox.SchemaKey{EventType: "order.paid", SchemaVersion: 2}))
	parkOne(ctx, old)

	// After the upgrade: list, dry-run, replay.
	upgraded, _ := inbox.New[*sql.Tx](drv, "shipping", noop, quiet)
	parked, _ := upgraded.ListParked(ctx, inbox.ParkedFilter{Reason: inbox.ReasonSchema})
	fmt.Println("parked:", len(parked), parked[0].Reason, parked[0].LastError)
	dry, _ := upgraded.DryRun(ctx, parked[0].ID)
	fmt.Println("dry run:", dry[0].Outcome)
	res, _ := upgraded.Replay(ctx, parked[0].ID)
	fmt.Println("replay:", res[0].Outcome)
	res, _ = upgraded.Replay(ctx, parked[0].ID)
	fmt.Println("again:", res[0].Err)
	// Output:
	// parked: 1 schema event type "order.paid" schema version 1 is not supported by this consumer
	// dry run: applied
	// replay: applied
	// again: inbox: message is no longer parked: id 1 was resolved as applied
}
