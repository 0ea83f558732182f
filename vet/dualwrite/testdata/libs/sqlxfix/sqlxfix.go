// Package sqlxfix: sqlx writes next to a segmentio/kafka-go publish.
package sqlxfix

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/segmentio/kafka-go"
)

// NamedExecThenWrite: sqlx NamedExecContext, then kafka-go WriteMessages.
func NamedExecThenWrite(ctx context.Context, db *sqlx.DB, w *kafka.Writer) error {
	if _, err := db.NamedExecContext(ctx, "INSERT INTO orders (id) VALUES (:id)", map[string]any{"id": 1}); err != nil {
		return err
	}
	return w.WriteMessages(ctx, kafka.Message{Value: []byte(`{}`)}) // want `dual write: NamedExecThenWrite publishes kafka.Writer.WriteMessages after the database write \(sqlx.DB.NamedExecContext`
}

// WriteBeforeCommit: an sqlx transaction with the publish before Commit.
func WriteBeforeCommit(ctx context.Context, db *sqlx.DB, w *kafka.Writer) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	tx.MustExecContext(ctx, "UPDATE orders SET paid = true WHERE id = $1", 1)
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(`{}`)}); err != nil { // want `publishes kafka.Writer.WriteMessages before commit`
		return err
	}
	return tx.Commit()
}

// SelectThenWrite reads only: not a dual write.
func SelectThenWrite(ctx context.Context, db *sqlx.DB, w *kafka.Writer) error {
	var ids []int64
	if err := db.SelectContext(ctx, &ids, "SELECT id FROM orders WHERE paid"); err != nil {
		return err
	}
	return w.WriteMessages(ctx, kafka.Message{Value: []byte(`{}`)})
}

// HelperThenCompressed: sqlx's package-level NamedExecContext, then
// kafka-go's Conn.WriteCompressedMessages.
func HelperThenCompressed(ctx context.Context, db *sqlx.DB, conn *kafka.Conn) error {
	if _, err := sqlx.NamedExecContext(ctx, db, "DELETE FROM carts WHERE id = :id", map[string]any{"id": 1}); err != nil {
		return err
	}
	_, err := conn.WriteCompressedMessages(nil, kafka.Message{Value: []byte(`{}`)}) // want `publishes kafka.Conn.WriteCompressedMessages after the database write \(sqlx.NamedExecContext`
	return err
}

// BeginxBeforeWrite: the transaction is opened with Beginx, the publish is
// before Commit.
func BeginxBeforeWrite(ctx context.Context, db *sqlx.DB, c *kafka.Client) error {
	tx, err := db.Beginx()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.NamedExec("INSERT INTO orders (id) VALUES (:id)", map[string]any{"id": 2}); err != nil {
		return err
	}
	if _, err := c.Produce(ctx, &kafka.ProduceRequest{Topic: "orders"}); err != nil { // want `publishes kafka.Client.Produce before commit`
		return err
	}
	return tx.Commit()
}
