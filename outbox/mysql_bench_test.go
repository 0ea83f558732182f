package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// BenchmarkProduceMySQL compares, on MySQL/MariaDB at 1 and 8 concurrent
// clients, (a) a business transaction alone (one INSERT), (b) the same plus
// a hand-written outbox INSERT with sequence 1 (no sequencing at all), and
// (c) the same through Ferry's InsertTx (per-aggregate sequence upsert
// under the savepoint). Each transaction is a new order (a new aggregate).
// The goal is (c) >= 0.90 x (b) in throughput at 8 clients (issue 16);
// docs/PERFORMANCE.md has the figures.
//
//	go test -run '^$' -bench BenchmarkProduceMySQL -benchtime 5s ./outbox/
func BenchmarkProduceMySQL(b *testing.B) {
	d := testenv.NewMySQLDatabase(b)
	ctx := context.Background()
	d.DB.SetMaxOpenConns(40)
	d.DB.SetMaxIdleConns(40)
	drv := mysql.New(d.DB)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		b.Fatal(err)
	}
	if _, err := d.DB.Exec(`CREATE TABLE orders (id varchar(64) PRIMARY KEY, tenant varchar(64) NOT NULL, created_at DATETIME(6) NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"order_id":"o","amount":4200,"currency":"EUR","lines":[{"sku":"a","qty":1}]}`)
	hand := `INSERT INTO ferry_outbox (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NOW(6))`
	variants := map[string]func(tx *sql.Tx, id string) error{
		"business-only": func(tx *sql.Tx, id string) error { return nil },
		"hand-written": func(tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, hand, uuid.Must(uuid.NewV7()).String(), "acme", "order", id, "order.created", 1, "order.events",
				ferry.ShardFor("acme", "order", id, 16), 16, "application/json", payload, time.Now().UTC(), "", "", "", "", "", "")
			return err
		},
		"ferry": func(tx *sql.Tx, id string) error {
			_, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id, EventType: "order.created", SchemaVersion: 1, Payload: payload})
			return err
		},
	}
	for _, clients := range []int{1, 8} {
		for _, name := range []string{"business-only", "hand-written", "ferry"} {
			write := variants[name]
			b.Run(fmt.Sprintf("clients=%d/%s", clients, name), func(b *testing.B) {
				work := make(chan int, b.N)
				for i := range b.N {
					work <- i
				}
				close(work)
				prefix := fmt.Sprintf("%s-%d-%s-", name, clients, uuid.NewString()[:8])
				var wg sync.WaitGroup
				errs := make(chan error, clients)
				b.ResetTimer()
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range work {
							id := fmt.Sprintf("%s%d", prefix, i)
							err := func() error {
								tx, err := d.DB.BeginTx(ctx, nil)
								if err != nil {
									return err
								}
								defer tx.Rollback()
								if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, tenant, created_at) VALUES (?, ?, ?)`, id, "acme", time.Now().UTC()); err != nil {
									return err
								}
								if err := write(tx, id); err != nil {
									return err
								}
								return tx.Commit()
							}()
							if err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
			})
		}
	}
}
