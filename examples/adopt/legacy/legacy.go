// Package legacy is the "before" of the adoption example: an order service
// that writes the order with database/sql and then publishes the event
// straight to NATS JetStream. That is a dual write: if the process dies (or
// the broker is down) between the commit and the publish, the order is
// stored and its event is lost. `ferry vet` reports PlaceOrder as
// "publishes … after commit"; examples/adopt is the fixed version.
//
// The package imports nothing from Ferry, as a service that has not adopted
// it yet would.
package legacy

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Subject is where order events go.
const Subject = "order.events"

// Schema creates the orders table.
const Schema = `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL)`

// Order is a placed order; its JSON is the event's payload.
type Order struct {
	ID         string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// Validate refuses an order the handler must not store.
func (o Order) Validate() error {
	switch {
	case o.ID == "" || len(o.ID) > 64:
		return fmt.Errorf("order.order_id must be 1..64 bytes, got %d", len(o.ID))
	case o.Customer == "":
		return errors.New("order.customer is required")
	case o.TotalCents < 1 || o.TotalCents > 10_000_000:
		return fmt.Errorf("order.total_cents must be in 1..10000000, got %d", o.TotalCents)
	}
	return nil
}

// Service is the old order service.
type Service struct {
	DB *sql.DB
	JS jetstream.JetStream
	// AfterCommit, when set, runs between the commit and the publish; an
	// error ends the handler there, as a crash would. It is the fault
	// injection point of the example's side-by-side test.
	AfterCommit func(orderID string) error
}

// PlaceOrder stores o and publishes it: the dual write.
func (s *Service) PlaceOrder(ctx context.Context, o Order) error {
	if err := o.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("legacy: encode order %s: %w", o.ID, err)
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("legacy: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`, o.ID, o.Customer, o.TotalCents); err != nil {
		return fmt.Errorf("legacy: insert order %s: %w", o.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("legacy: commit order %s: %w", o.ID, err)
	}
	if s.AfterCommit != nil {
		if err := s.AfterCommit(o.ID); err != nil {
			return fmt.Errorf("legacy: after commit of order %s: %w", o.ID, err)
		}
	}
	if _, err := s.JS.Publish(ctx, Subject, body); err != nil {
		return fmt.Errorf("legacy: publish order %s: %w", o.ID, err)
	}
	return nil
}
