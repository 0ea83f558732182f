package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// BenchmarkSQLiteInsertTx measures one transaction with an InsertTx call of
// n events on SQLite (the call runs under a savepoint).
//
//	go test -run '^$' -bench BenchmarkSQLiteInsertTx ./outbox/
func BenchmarkSQLiteInsertTx(b *testing.B) {
	db, _ := testenv.NewSQLite(b)
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		b.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			events := make([]ferry.Event, n)
			for i := range events {
				events[i] = ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%4), EventType: "order.touched", SchemaVersion: 1}
			}
			for range b.N {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.InsertTx(ctx, tx, events...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
