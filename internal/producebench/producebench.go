// Package producebench measures what the outbox costs a producer on
// Postgres (Runner) and on MySQL/MariaDB (MySQLRunner): (a) a business transaction alone, (b) the same plus a
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

// Reference variants decompose the gap between (b) and (c); they are not
// part of the target. Each is one outbox statement in the same transaction
// as (a), so the difference between two of them is the cost of one idea.
const (
	// FerryShapeNoSeq is Ferry's statement shape — every column as a
	// parameter, next_attempt_at = now() — with a constant sequence: the
	// cost of the shape without sequencing.
	FerryShapeNoSeq Variant = "x_ferry_shape_no_seq"
	// OnConflictFloor inserts sequence 1 with ON CONFLICT DO NOTHING on
	// the outbox's own (aggregate, seq) key and RETURNING. It allocates
	// nothing: it is the floor for any one-statement scheme that notices a
	// concurrent writer of the same aggregate through ON CONFLICT (the way
	// to do so without aborting the caller's transaction) — it reads no
	// sequence and writes no sequence row.
	OnConflictFloor Variant = "x_on_conflict_floor"
	// OutboxMax is the alternative allocation that writes no sequence row:
	// max(aggregate_seq)+1 from the outbox's unique index (a
	// cleaned-up aggregate's last sequence from aggregate_seq), inserted
	// with ON CONFLICT DO NOTHING so a concurrent writer is detected and
	// the statement retried.
	OutboxMax Variant = "x_outbox_max_seq"
)

// ReferenceVariants lists the reference variants.
var ReferenceVariants = []Variant{FerryShapeNoSeq, OnConflictFloor, OutboxMax}

// Setup creates the business table and Ferry's tables in the pool's
// search_path (opts: e.g. a partitioned outbox). It is idempotent.
func Setup(ctx context.Context, pool *pgxpool.Pool, tables ferry.Tables, opts ...migrate.Option) error {
	if _, err := migrate.Up(ctx, pgxv5.New(pool), tables, opts...); err != nil {
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
	refSQL  map[Variant]string
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
	return &Runner{pool: pool, writer: w, handSQL: hand, refSQL: referenceSQL(tables),
		payload: []byte(`{"amount_cents":4200,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)}, nil
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
		q, ok := r.refSQL[v]
		if !ok {
			return fmt.Errorf("unknown variant %q", v)
		}
		if err := r.runReference(ctx, tx, q, id); err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
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
	// CPU per transaction, when it could be measured (see CPUClock).
	ClientCPUPerTx time.Duration `json:"client_cpu_per_tx_ns,omitempty"`
	ServerCPUPerTx time.Duration `json:"server_cpu_per_tx_ns,omitempty"`
}

// Measure runs v with clients concurrent workers for d and returns the rate.
func (r *Runner) Measure(ctx context.Context, v Variant, clients int, d time.Duration) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	cpu0 := ReadCPU()
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
	cpu1 := ReadCPU()
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	res := Result{Variant: v, Clients: clients, Txns: n.Load(), Elapsed: elapsed, TxPerSec: float64(n.Load()) / elapsed.Seconds()}
	if txns := n.Load(); txns > 0 {
		if cpu0.Client >= 0 && cpu1.Client >= 0 {
			res.ClientCPUPerTx = (cpu1.Client - cpu0.Client) / time.Duration(txns)
		}
		if cpu0.Server >= 0 && cpu1.Server >= 0 {
			res.ServerCPUPerTx = (cpu1.Server - cpu0.Server) / time.Duration(txns)
		}
	}
	return res, nil
}
