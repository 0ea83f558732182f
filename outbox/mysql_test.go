package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/storetest"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func TestConformanceMySQL(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		d := testenv.NewMySQLDatabase(t)
		return storetest.Harness[*sql.Tx]{Driver: mysql.New(d.DB)}
	})
}

func TestConformanceMySQLExplicitDatabaseAndPrefix(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		d := testenv.NewMySQLDatabase(t)
		return storetest.Harness[*sql.Tx]{Driver: mysql.New(d.DB), Tables: ferry.Tables{Schema: d.Name, Prefix: "app_"}}
	})
}

// cancelAfterFirst is driver/mysql's driver whose caller-transaction
// executor cancels ctx right after the first statement (the sequence
// upsert of a one-aggregate call).
type cancelAfterFirst struct {
	driver.Driver[*sql.Tx]
	cancel context.CancelFunc
}

func (c *cancelAfterFirst) UnwrapExecutor(tx *sql.Tx) driver.Executor {
	return &cancelFirstExec{Executor: c.Driver.UnwrapExecutor(tx), cancel: c.cancel}
}

type cancelFirstExec struct {
	driver.Executor
	cancel context.CancelFunc
}

func (c *cancelFirstExec) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	defer c.cancel()
	return c.Executor.Exec(ctx, q, args...)
}

// TestMySQLFastPathUndoesItsUpserts: the savepoint-free path (one chunk,
// no caller-supplied versions) cancelled after its sequence upsert, and
// failed on a duplicate id after it, leaves the transaction usable with the
// sequence rows as before: a created row deleted, a bump subtracted.
func TestMySQLFastPathUndoesItsUpserts(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Insert(ctx, storetestEvent("old"))
	if err != nil {
		t.Fatal(err)
	}
	seqs := func() string {
		rows, err := d.DB.Query(`SELECT aggregate_id, last_seq FROM ferry_aggregate_seq ORDER BY aggregate_id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var id string
			var n int64
			if err := rows.Scan(&id, &n); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s=%d ", id, n)
		}
		return b.String()
	}
	before := seqs()
	for _, agg := range []string{"old", "new"} {
		callCtx, cancel := context.WithCancel(ctx)
		cw, err := outbox.New[*sql.Tx](&cancelAfterFirst{Driver: drv, cancel: cancel})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := d.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cw.InsertTx(callCtx, tx, storetestEvent(agg)); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: err = %v, want context.Canceled", agg, err)
		}
		// Duplicate of an id already in the outbox: fails in the INSERT,
		// after the upsert.
		dup := storetestEvent(agg)
		dup.ID = first[0].ID
		if _, err := w.InsertTx(ctx, tx, dup); !errors.Is(err, ferry.ErrDuplicateEventID) {
			t.Fatalf("%s: duplicate: %v", agg, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("%s: commit after the failed calls: %v", agg, err)
		}
		if got := seqs(); got != before {
			t.Fatalf("%s: sequences %q after the failed calls, want %q", agg, got, before)
		}
	}
	var n int
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM ferry_outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox rows %d %v, want 1", n, err)
	}
}

func storetestEvent(agg string) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}
}
