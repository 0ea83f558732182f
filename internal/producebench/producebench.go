// Package producebench measures what the outbox costs a producer on
// Postgres: (a) a business transaction alone, (b) the same plus a
// hand-written outbox INSERT, (c) the same through Ferry's writer with
// per-aggregate sequencing. It backs both `go test -bench` in outbox/ and
// `ferry bench produce`.
package producebench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// Variant is one of the three measured transactions.
type Variant string

// The variants, in the order the issue names them.
const (
	BusinessOnly   Variant = "a_business_only"
	HandWritten    Variant = "b_hand_written_outbox"
	FerrySequenced Variant = "c_ferry_sequenced"
)

// Variants lists all three.
var Variants = []Variant{BusinessOnly, HandWritten, FerrySequenced}

// Setup creates the business table and Ferry's tables in the pool's
// search_path. It is idempotent.
func Setup(ctx context.Context, pool *pgxpool.Pool, tables ferry.Tables) error {
	if _, err := migrate.Up(ctx, pgxv5.New(pool), tables); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_orders (id text PRIMARY KEY, tenant text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// Runner executes one transaction of a variant.
type Runner struct {
	pool    *pgxpool.Pool
	writer  *outbox.Writer[pgx.Tx]
	handSQL string
	payload []byte
}

// New returns a Runner. notify enables outbox.WithNotify on the Ferry variant.
func New(pool *pgxpool.Pool, tables ferry.Tables, notify string) (*Runner, error) {
	var opts []outbox.Option
	opts = append(opts, outbox.WithTables(tables))
	if notify != "" {
		opts = append(opts, outbox.WithNotify(notify))
	}
	w, err := outbox.New(pgxv5.New(pool), opts...)
	if err != nil {
		return nil, err
	}
	hand := fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
		topic, shard, shard_count, content_type, payload, occurred_at) VALUES ($1, $2, 'order', $3, 1, 'order.created', 1, 'order.events', $4, 16, 'application/json', $5, now())`,
		tables.Name("outbox"))
	return &Runner{pool: pool, writer: w, handSQL: hand, payload: []byte(`{"amount_cents":4200,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)}, nil
}

// Run executes one transaction of v for a fresh order.
func (r *Runner) Run(ctx context.Context, v Variant) error {
	id := uuid.Must(uuid.NewV7()).String()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO bench_orders (id, tenant, amount_cents) VALUES ($1, 'acme', 4200)`, id); err != nil {
		return err
	}
	switch v {
	case BusinessOnly:
	case HandWritten:
		if _, err := tx.Exec(ctx, r.handSQL, uuid.Must(uuid.NewV7()).String(), "acme", id, ferry.ShardFor("acme", "order", id, 16), r.payload); err != nil {
			return err
		}
	case FerrySequenced:
		if _, err := r.writer.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id,
			EventType: "order.created", SchemaVersion: 1, Payload: r.payload}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown variant %q", v)
	}
	return tx.Commit(ctx)
}

// Result is one measurement.
type Result struct {
	Variant  Variant       `json:"variant"`
	Clients  int           `json:"clients"`
	Txns     int64         `json:"txns"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	TxPerSec float64       `json:"tx_per_sec"`
}

// Measure runs v with clients concurrent workers for d and returns the rate.
func (r *Runner) Measure(ctx context.Context, v Variant, clients int, d time.Duration) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	start := time.Now()
	deadline := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := r.Run(ctx, v); err != nil {
					errc <- err
					cancel()
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	return Result{Variant: v, Clients: clients, Txns: n.Load(), Elapsed: elapsed, TxPerSec: float64(n.Load()) / elapsed.Seconds()}, nil
}
