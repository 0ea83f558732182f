// Package clean holds code the analyzer must not report.
package clean

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// ReadThenPublish: a read-only query beside a publish is not a dual write.
func ReadThenPublish(ctx context.Context, db *sql.DB, pool *pgxpool.Pool, nc *nats.Conn) error {
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM orders").Scan(&n); err != nil {
		return err
	}
	rows, err := pool.Query(ctx, "SELECT id FROM orders")
	if err != nil {
		return err
	}
	rows.Close()
	if _, err := db.ExecContext(ctx, "SELECT pg_sleep(0)"); err != nil {
		return err
	}
	return nc.Publish("orders.counted", nil)
}

// ThroughOutbox writes the event with outbox.InsertTx and publishes nothing.
func ThroughOutbox(ctx context.Context, db *sql.DB, w *outbox.Writer[*sql.Tx]) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (1)"); err != nil {
		return err
	}
	if _, err := w.InsertTx(ctx, tx, ferry.Event{EventType: "order.created", AggregateType: "order", AggregateID: "1", Payload: []byte(`{}`)}); err != nil {
		return err
	}
	return tx.Commit()
}

// Two request paths: one writes, the other publishes. Registering them on a
// mux passes function values, which is not a call path.
func createOrder(db *sql.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = db.ExecContext(r.Context(), "INSERT INTO orders (id) VALUES (1)")
	}
}

func ping(nc *nats.Conn) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { _ = nc.Publish("ping", nil) }
}

// Routes wires both paths.
func Routes(mux *http.ServeMux, db *sql.DB, nc *nats.Conn) {
	mux.Handle("/orders", createOrder(db))
	mux.Handle("/ping", ping(nc))
}

// Publisher is a user type whose Publish method is not a broker client.
type Publisher struct{}

// Publish looks like a broker call by name only.
func (Publisher) Publish(string, []byte) error { return nil }

// LookAlike: a user method named Publish next to a write is not matched.
func LookAlike(ctx context.Context, db *sql.DB, p Publisher) error {
	_, _ = db.ExecContext(ctx, "INSERT INTO orders (id) VALUES (1)")
	return p.Publish("x", nil)
}
