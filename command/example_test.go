package command_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/command"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// A client retries "place order" with the same Idempotency-Key: the order
// and its event are written once, and the retry gets the stored answer.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-command-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	events, err := outbox.New(drv)
	if err != nil {
		log.Fatal(err)
	}
	runner, err := command.New(drv, command.WithExpiry(48*time.Hour), command.WithReplayWindow(24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}

	placeOrder := func(ctx context.Context, tx *sql.Tx) (command.Result, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('o1')`); err != nil {
			return command.Result{}, err
		}
		evs, err := events.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o1",
			EventType: "order.placed", SchemaVersion: 1, Payload: []byte(`{}`)})
		if err != nil {
			return command.Result{}, err
		}
		return command.Result{Body: []byte(`{"order":"o1"}`), EventIDs: []uuid.UUID{evs[0].ID}}, nil
	}
	req := command.Request{TenantID: "acme", Key: "client-key-1", Body: []byte(`{"item":"book"}`)}

	first, err := runner.Run(ctx, req, placeOrder)
	if err != nil {
		log.Fatal(err)
	}
	retry, err := runner.Run(ctx, req, placeOrder)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Replayed, retry.Replayed, string(retry.Body), retry.EventIDs[0] == first.EventIDs[0])

	req.Body = []byte(`{"item":"pen"}`)
	_, err = runner.Run(ctx, req, placeOrder)
	fmt.Println(errors.Is(err, command.ErrIdempotencyKeyReused))

	var orders int
	_ = db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// false true {"order":"o1"} true
	// true
	// orders: 1
}
