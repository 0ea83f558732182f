package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// TestMySQLConcurrentNewAggregatesLoseNothing: 16 writers each commit 60
// transactions that create three new aggregates at once, interleaved in
// key order with the other writers' (the pattern that makes InnoDB's
// insert-intention and gap locks deadlock), at READ COMMITTED (Open's
// level) and at REPEATABLE READ (InnoDB's default, for callers who begin
// their own). A transaction that fails with driver.ErrDeadlock is retried
// whole, as InsertTx documents; in the end every committed transaction's
// events and business row are there exactly once, with gapless sequences,
// and nothing of a failed attempt is.
func TestMySQLConcurrentNewAggregatesLoseNothing(t *testing.T) {
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead} {
		t.Run(iso.String(), func(t *testing.T) {
			d := testenv.NewMySQLDatabase(t)
			ctx := context.Background()
			drv := mysql.New(d.DB)
			if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.DB.Exec(`CREATE TABLE orders (id varchar(64) PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			w, err := outbox.New(drv)
			if err != nil {
				t.Fatal(err)
			}
			const writers, txs = 16, 60
			var deadlocks, other atomic.Int64
			var wg sync.WaitGroup
			for g := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range txs {
						// Keys of different writers interleave: a-0000-g, a-0001-g, …
						ids := []string{fmt.Sprintf("a-%04d-%02d", i, g), fmt.Sprintf("b-%04d-%02d", i, g), fmt.Sprintf("c-%04d-%02d", i, g)}
						for attempt := 0; ; attempt++ {
							err := func() error {
								tx, err := d.DB.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
								if err != nil {
									return err
								}
								defer tx.Rollback()
								if _, err := tx.Exec(`INSERT INTO orders (id) VALUES (?)`, ids[0]); err != nil {
									return err
								}
								events := make([]ferry.Event, 0, 6)
								for _, id := range ids {
									e := ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id, EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}
									events = append(events, e, e)
								}
								if _, err := w.InsertTx(ctx, tx, events...); err != nil {
									return err
								}
								return tx.Commit()
							}()
							if err == nil {
								break
							}
							if !errors.Is(err, driver.ErrDeadlock) || attempt > 50 {
								other.Add(1)
								t.Errorf("writer %d tx %d: %v", g, i, err)
								return
							}
							deadlocks.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d deadlocks retried in %d transactions", iso, deadlocks.Load(), writers*txs)
			var orders, rows, aggs, bad int
			if err := d.DB.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&orders); err != nil {
				t.Fatal(err)
			}
			if err := d.DB.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT aggregate_id) FROM ferry_outbox`).Scan(&rows, &aggs); err != nil {
				t.Fatal(err)
			}
			if err := d.DB.QueryRow(`SELECT COUNT(*) FROM ferry_aggregate_seq s WHERE last_seq <> 2 OR last_seq <> (SELECT MAX(aggregate_seq) FROM ferry_outbox o WHERE o.aggregate_id = s.aggregate_id)`).Scan(&bad); err != nil {
				t.Fatal(err)
			}
			if orders != writers*txs || rows != writers*txs*6 || aggs != writers*txs*3 || bad != 0 {
				t.Fatalf("orders %d (want %d), outbox rows %d (want %d), aggregates %d (want %d), bad sequences %d",
					orders, writers*txs, rows, writers*txs*6, aggs, writers*txs*3, bad)
			}
		})
	}
}
