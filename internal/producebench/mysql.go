package producebench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// MySQLRunner is Runner on MySQL/MariaDB (a *sql.DB from mysql.Open): the
// same three variants — (a) the business INSERT alone, (b) plus a
// hand-written outbox INSERT with sequence 1, (c) plus Ferry's InsertTx —
// each in its own transaction for a fresh order. The reference variants
// are Postgres statements and are not offered here.
type MySQLRunner struct {
	db      *sql.DB
	writer  *outbox.Writer[*sql.Tx]
	handSQL string
	payload []byte
}

// SetupMySQL creates Ferry's tables and the business table in db's
// database. It is idempotent.
func SetupMySQL(ctx context.Context, db *sql.DB, tables ferry.Tables) error {
	if _, err := migrate.Up(ctx, mysql.New(db), tables); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bench_orders (id varchar(64) PRIMARY KEY, tenant varchar(64) NOT NULL,
		amount_cents bigint NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB`)
	return err
}

// NewMySQL returns a MySQLRunner over db (opened with mysql.Open).
func NewMySQL(db *sql.DB, tables ferry.Tables) (*MySQLRunner, error) {
	if err := tables.Check(); err != nil {
		return nil, err
	}
	w, err := outbox.New(mysql.New(db), outbox.WithTables(tables))
	if err != nil {
		return nil, err
	}
	// Backticks: the statement goes to the server as written, not through
	// the databasesql core's rewrite.
	name := "`" + tables.Bare("outbox") + "`"
	if tables.Schema != "" {
		name = "`" + tables.Schema + "`." + name
	}
	hand := fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
		topic, shard, shard_count, content_type, payload, occurred_at) VALUES (?, ?, 'order', ?, 1, 'order.created', 1, 'order.events', ?, 16, 'application/json', ?, NOW(6))`, name)
	return &MySQLRunner{db: db, writer: w, handSQL: hand,
		payload: []byte(`{"amount_cents":4200,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)}, nil
}

// Run executes one transaction of v for a fresh order.
func (r *MySQLRunner) Run(ctx context.Context, v Variant) error {
	if err := mysqlVariant(v); err != nil {
		return err
	}
	id := uuid.Must(uuid.NewV7()).String()
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO bench_orders (id, tenant, amount_cents) VALUES (?, 'acme', 4200)`, id); err != nil {
		return err
	}
	switch v {
	case BusinessOnly:
	case HandWritten:
		if _, err := tx.ExecContext(ctx, r.handSQL, uuid.Must(uuid.NewV7()).String(), "acme", id, ferry.ShardFor("acme", "order", id, 16), r.payload); err != nil {
			return err
		}
	case FerrySequenced:
		if _, err := r.writer.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id,
			EventType: "order.created", SchemaVersion: 1, Payload: r.payload}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// mysqlVariant refuses the variants MySQLRunner does not measure (the
// Postgres reference statements).
func mysqlVariant(v Variant) error {
	switch v {
	case BusinessOnly, HandWritten, FerrySequenced:
		return nil
	}
	return fmt.Errorf("variant %q is not measured on MySQL (want %s, %s or %s)", v, BusinessOnly, HandWritten, FerrySequenced)
}

// Measure runs v with clients concurrent workers for d and returns the
// rate (no CPU figures: ReadCPU reads Postgres's processes).
func (r *MySQLRunner) Measure(ctx context.Context, v Variant, clients int, d time.Duration) (Result, error) {
	if clients < 1 {
		return Result{}, fmt.Errorf("clients must be >= 1, got %d", clients)
	}
	// Refused before the clock starts: with a short d a client might not
	// run once, and the refusal would go unseen.
	if err := mysqlVariant(v); err != nil {
		return Result{}, err
	}
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
			for time.Now().Before(deadline) && ctx.Err() == nil {
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
