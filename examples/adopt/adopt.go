// Package adopt is the adoption example of docs/ADOPTING.md: an order
// service before and after Ferry, run side by side.
//
// The "before" is package legacy: PlaceOrder commits the order with
// database/sql and then publishes to NATS JetStream, a dual write that
// `ferry vet` reports. Service here is the same handler fixed: it writes the
// event with outbox.InsertTx in the order's transaction, and the real relay
// publishes it. Run feeds the same orders to both under injected faults (the
// old path is cut between commit and publish at a seeded rate; the relay
// crashes after publishing and before marking), with the relay in shadow
// mode (subject prefix "shadow."), and compares the two streams with
// shadow.Compare: the old path's losses are the cut orders; the outbox loses
// none.
//
// cmd/adopt prints the figure: go run ./examples/adopt/cmd/adopt
package adopt

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/examples/adopt/legacy"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// Shards is the outbox's and the relay's shard count.
const Shards = 1

// Service is the fixed order service over one SQLite database.
type Service struct {
	DB     *sql.DB
	Driver *databasesql.Driver
	outbox *outbox.Writer[*sql.Tx]
	// AfterCommit, when set, runs after the commit, as in legacy.Service;
	// an error ends the handler there. Nothing is lost: the event was
	// committed with the order.
	AfterCommit func(orderID string) error
}

// Open opens (creating) the SQLite database at path with Ferry's tables and
// the orders table.
func Open(ctx context.Context, path string) (*Service, error) {
	db, err := sqlite.Open(path)
	if err != nil {
		return nil, fmt.Errorf("adopt: open %s: %w", path, err)
	}
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("adopt: migrate: %w", err)
	}
	if _, err := db.ExecContext(ctx, legacy.Schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("adopt: orders table: %w", err)
	}
	// One shard: the relay then publishes in commit order, so the shadow
	// comparison's global "reordered" count is meaningful. With several
	// shards, orders (each its own aggregate) are published in parallel and
	// only each aggregate's order holds (G3), which a global count reports
	// as reordered.
	w, err := outbox.New(drv, outbox.WithShardCount(Shards))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("adopt: outbox: %w", err)
	}
	return &Service{DB: db, Driver: drv, outbox: w}, nil
}

// Close closes the database.
func (s *Service) Close() error { return s.DB.Close() }

// PlaceOrder stores o and its order.placed event in one transaction. The
// payload is the same JSON the legacy handler publishes, so the shadow
// comparison can match the two by order_id.
func (s *Service) PlaceOrder(ctx context.Context, o legacy.Order) error {
	if err := o.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("adopt: encode order %s: %w", o.ID, err)
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("adopt: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`, o.ID, o.Customer, o.TotalCents); err != nil {
		return fmt.Errorf("adopt: insert order %s: %w", o.ID, err)
	}
	if _, err := s.outbox.InsertTx(ctx, tx, ferry.Event{TenantID: "shop", AggregateType: "order", AggregateID: o.ID,
		EventType: "order.placed", SchemaVersion: 1, Topic: legacy.Subject, Payload: body}); err != nil {
		return fmt.Errorf("adopt: outbox order %s: %w", o.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("adopt: commit order %s: %w", o.ID, err)
	}
	if s.AfterCommit != nil {
		if err := s.AfterCommit(o.ID); err != nil {
			return fmt.Errorf("adopt: after commit of order %s: %w", o.ID, err)
		}
	}
	return nil
}
