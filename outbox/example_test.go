package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// Write a business row and its event in one transaction. With pgx, pass
// pgxv5.New(pool) and a pgx.Tx instead; the calls are the same.
func ExampleWriter_InsertTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-example-")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY)`)

	w, err := outbox.New(drv)
	if err != nil {
		panic(err)
	}
	placeOrder := func(id string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // no-op after Commit
		if _, err := tx.Exec(`INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
			return err
		}
		events, err := w.InsertTx(ctx, tx, ferry.Event{
			TenantID: "acme", AggregateType: "order", AggregateID: id,
			EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{"total":42}`),
		})
		if err != nil {
			return err
		}
		fmt.Printf("%s: seq %d on topic %s\n", id, events[0].AggregateSeq, events[0].Topic)
		return tx.Commit()
	}
	if err := placeOrder("o-1"); err != nil {
		panic(err)
	}
	// Output:
	// o-1: seq 1 on topic order.events
}

// A caller that knows the aggregate's version passes it; a stale version
// is rejected with ErrSequenceConflict and nothing is written.
func ExampleWriter_Insert_expectedVersion() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-example-")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	drv := sqlite.New(db)
	_, _ = migrate.Up(ctx, drv, ferry.Tables{})
	w, _ := outbox.New[*sql.Tx](drv)

	ev := ferry.Event{TenantID: "acme", AggregateType: "account", AggregateID: "a-1", EventType: "account.credited", SchemaVersion: 1}
	ev.AggregateSeq = 1
	_, err := w.Insert(ctx, ev)
	fmt.Println("seq 1:", err)
	_, err = w.Insert(ctx, ev) // another writer already took seq 1
	fmt.Println("seq 1 again is a conflict:", errors.Is(err, ferry.ErrSequenceConflict))
	// Output:
	// seq 1: <nil>
	// seq 1 again is a conflict: true
}
