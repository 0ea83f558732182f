package producebench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
)

// errConflict reports that a reference statement met a concurrent writer of
// its aggregate; with a fresh order id per transaction it never should.
var errConflict = errors.New("insert returned no row (conflict)")

func referenceSQL(t ferry.Tables) map[Variant]string {
	cols := fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)`, t.Name("outbox"))
	values := `$5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, now()`
	onConflict := `ON CONFLICT (tenant_id, aggregate_type, aggregate_id, aggregate_seq) DO NOTHING`
	return map[Variant]string{
		FerryShapeNoSeq: fmt.Sprintf(`%s
VALUES ($1, $2, $3, $4, 1, %s)
RETURNING aggregate_seq`, cols, values),
		OnConflictFloor: fmt.Sprintf(`%s
VALUES ($1, $2, $3, $4, 1, %s)
%s
RETURNING aggregate_seq`, cols, values, onConflict),
		OutboxMax: fmt.Sprintf(`%s
SELECT $1, $2, $3, $4, coalesce(
        (SELECT max(aggregate_seq) FROM %[3]s WHERE tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4),
        (SELECT last_seq FROM %[4]s WHERE tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4),
        0) + 1,
    %[2]s
%[5]s
RETURNING aggregate_seq`, cols, values, t.Name("outbox"), t.Name("aggregate_seq"), onConflict),
	}
}

// runReference sends one reference statement with the same arguments
// Ferry's writer sends for the order.
func (r *Runner) runReference(ctx context.Context, tx pgx.Tx, q, orderID string) error {
	rows, err := tx.Query(ctx, q, uuid.Must(uuid.NewV7()).String(), "acme", "order", orderID,
		"order.created", int32(1), "order.events", int32(ferry.ShardFor("acme", "order", orderID, 16)), int32(16),
		"application/json", r.payload, time.Now().UTC(), "", "", "", "", "", "")
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != 1 {
		return errConflict
	}
	return nil
}
