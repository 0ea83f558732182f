// Package shapes holds the dual writes the analyzer must report, one per
// shape, each against a real client library.
package shapes

import (
	"context"
	"database/sql"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// PublishAfterCommit: database/sql transaction, then a NATS core publish.
func PublishAfterCommit(ctx context.Context, db *sql.DB, nc *nats.Conn) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1)", 1); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return nc.Publish("orders.created", []byte(`{}`)) // want `dual write: PublishAfterCommit publishes nats.Conn.Publish after commit \(sql.Tx.Commit at line \d+\)`
}

// PublishBeforeCommit: pgx transaction, JetStream publish before Commit.
func PublishBeforeCommit(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "UPDATE orders SET paid = true WHERE id = $1", 1); err != nil {
		return err
	}
	if _, err := js.Publish(ctx, "orders.paid", []byte(`{}`)); err != nil { // want `publishes jetstream.Publisher.Publish before commit \(inside the transaction\)`
		return err
	}
	return tx.Commit(ctx)
}

// PublishInDefer: the publish is deferred; the write is an autocommit Exec.
func PublishInDefer(ctx context.Context, db *sql.DB, cl *kgo.Client) error {
	defer cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte(`{}`)}) // want `publishes kgo.Client.ProduceSync in a defer of PublishInDefer`
	_, err := db.ExecContext(ctx, "DELETE FROM carts WHERE id = $1", 1)
	return err
}

// PublishInsideTx: the publish runs in pgx.BeginFunc's callback.
func PublishInsideTx(ctx context.Context, pool *pgxpool.Pool, ch *amqp.Channel) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES (1)"); err != nil {
			return err
		}
		return ch.PublishWithContext(ctx, "ex", "payments", false, false, amqp.Publishing{Body: []byte(`{}`)}) // want `publishes amqp.Channel.PublishWithContext inside the transaction`
	})
}

// PublishInGoroutine: the handler writes, then fires the publish in a goroutine.
func PublishInGoroutine(ctx context.Context, db *sql.DB, p sarama.SyncProducer) error {
	if _, err := db.ExecContext(ctx, "INSERT INTO orders (id) VALUES (2)"); err != nil {
		return err
	}
	go func() {
		_, _, _ = p.SendMessage(&sarama.ProducerMessage{Topic: "orders"}) // want `publishes sarama.SyncProducer.SendMessage in a goroutine started from PublishInGoroutine`
	}()
	return nil
}

// PublishBeforeWrite: publish first, then an autocommit write.
func PublishBeforeWrite(ctx context.Context, conn *pgx.Conn, ap sarama.AsyncProducer) error {
	ap.Input() <- &sarama.ProducerMessage{Topic: "orders"} // want `publishes sarama.AsyncProducer.Input\(\) <- before the database write`
	_, err := conn.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id"}, pgx.CopyFromRows([][]any{{1}}))
	return err
}

// InsertReturning: a Query with a constant INSERT … RETURNING is a write.
func InsertReturning(ctx context.Context, db *sql.DB, nc *nats.Conn) (int64, error) {
	var id int64
	if err := db.QueryRowContext(ctx, "INSERT INTO orders (total) VALUES (1) RETURNING id").Scan(&id); err != nil {
		return 0, err
	}
	return id, nc.Publish("orders.created", nil) // want `publishes nats.Conn.Publish after the database write`
}

// save writes; notify publishes: both one level below Checkout.
func save(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, "UPDATE stock SET n = n - 1")
	return err
}

func notify(nc *nats.Conn) error { return nc.Publish("stock.changed", nil) }

// Checkout reaches both writes through same-package callees.
func Checkout(ctx context.Context, db *sql.DB, nc *nats.Conn) error {
	if err := save(ctx, db); err != nil {
		return err
	}
	return notify(nc) // want `publishes nats.Conn.Publish \(in notify, called here\) after the database write \(sql.DB.ExecContext in save`
}

// DBTX is the interface sqlc generates; its Exec returns sql.Result.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ThroughDBTX writes through a user interface typed by its sql.Result.
func ThroughDBTX(ctx context.Context, q DBTX, nc *nats.Conn, sql string) error {
	if _, err := q.ExecContext(ctx, sql); err != nil {
		return err
	}
	return nc.Publish("x", nil) // want `publishes nats.Conn.Publish after the database write \(shapes.DBTX.ExecContext`
}

// Accepted is a reviewed dual write.
//
//ferry:ignore dualwrite metrics side channel, loss is acceptable
func Accepted(ctx context.Context, db *sql.DB, nc *nats.Conn) error {
	_, _ = db.ExecContext(ctx, "INSERT INTO audit (x) VALUES (1)")
	return nc.Publish("audit", nil)
}

// AcceptedLine is suppressed at the line.
func AcceptedLine(ctx context.Context, db *sql.DB, nc *nats.Conn) error {
	_, _ = db.ExecContext(ctx, "INSERT INTO audit (x) VALUES (1)")
	//ferry:ignore dualwrite cache invalidation only, idempotent
	return nc.Publish("cache.invalidate", nil)
}

// NoReason: a directive without a reason does not suppress and is reported.
func NoReason(ctx context.Context, db *sql.DB, nc *nats.Conn) error {
	_, _ = db.ExecContext(ctx, "INSERT INTO audit (x) VALUES (1)")
	//ferry:ignore dualwrite // want `needs a reason`
	return nc.Publish("audit", nil) // want `dual write: NoReason`
}

// HandlerFactory returns a handler whose body is the dual write: the
// returned literal is analysed as a unit of its own.
func HandlerFactory(db *sql.DB, nc *nats.Conn) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := db.ExecContext(ctx, "INSERT INTO orders (id) VALUES (3)"); err != nil {
			return err
		}
		return nc.Publish("orders.created", nil) // want `dual write: func literal in HandlerFactory publishes nats.Conn.Publish after the database write`
	}
}
