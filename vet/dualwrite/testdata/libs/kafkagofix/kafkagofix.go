// Package kafkagofix: database/sql next to kafka-go's Conn.
package kafkagofix

import (
	"context"
	"database/sql"

	"github.com/segmentio/kafka-go"
)

// ExecThenConnWrite: an autocommit Exec, then a write on a kafka-go Conn.
func ExecThenConnWrite(ctx context.Context, db *sql.DB, conn *kafka.Conn) error {
	if _, err := db.ExecContext(ctx, "DELETE FROM carts WHERE id = $1", 1); err != nil {
		return err
	}
	_, err := conn.WriteMessages(kafka.Message{Value: []byte(`{}`)}) // want `publishes kafka.Conn.WriteMessages after the database write`
	return err
}

// QueryThenConnWrite reads only: not a dual write.
func QueryThenConnWrite(ctx context.Context, db *sql.DB, conn *kafka.Conn) error {
	rows, err := db.QueryContext(ctx, "SELECT id FROM carts")
	if err != nil {
		return err
	}
	rows.Close()
	_, err = conn.WriteMessages(kafka.Message{Value: []byte(`{}`)})
	return err
}
