// Package statebench measures where the relay's per-event state could live
// (#17 item 1): today's status update, a HOT mark, a narrow state table, a
// per-shard watermark with an exceptions table and COPY-based marks, each
// on a scratch outbox built by Ferry's own migrations. It also holds the
// server-side outbox pre-fill that `ferry bench relay --backlog` uses, and
// WatermarkDrain, the prototype drain of the recommended design behind
// `ferry bench relay --backlog N --prototype watermark`.
// Benchmark code: nothing in it runs in production.
package statebench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry"
)

// Execer is what the pre-fill needs of a pool, connection or transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Fill describes rows Prefill writes to an outbox in one INSERT … SELECT
// generate_series: Marked rows first, then Pending rows, so marked rows
// have the lower ids. Aggregate i is AggregatePrefix+i (i < Aggregates),
// on its real shard (ferry.ShardFor over Shards), with
// per-aggregate sequences in id order; event ids are time-ordered like the
// writer's UUIDv7s.
type Fill struct {
	Topic           string
	Marked, Pending int
	Aggregates      int
	PayloadBytes    int    // >= 2 (a JSON string)
	AggregatePrefix string // default "agg-"
	// MarkedStatus: marked rows get status 'sent', published_at and a
	// receipt (today's schema). Otherwise marked rows stay 'pending' and
	// MarkedColumn, when set, is set to now() on them (a HOT design).
	MarkedStatus bool
	MarkedColumn string
	// Shards is the outbox's shard count (0: ferry.DefaultShardCount).
	Shards int
	// At, when set, is every row's created_at and occurred_at (and the
	// marked rows' published_at) instead of now(): rows of a past day,
	// e.g. for cleanup (bench cleanup).
	At time.Time
}

// Prefill writes f's rows into the outbox of t.
func Prefill(ctx context.Context, db Execer, t ferry.Tables, f Fill) error {
	sql, args, err := f.insert(t)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("statebench: pre-fill %d rows: %w", f.Marked+f.Pending, err)
	}
	return fillSequences(ctx, db, t, f.prefix())
}

func (f Fill) prefix() string {
	if f.AggregatePrefix == "" {
		return "agg-"
	}
	return f.AggregatePrefix
}

// insert is the outbox INSERT … SELECT generate_series and its arguments.
func (f Fill) insert(t ferry.Tables) (string, []any, error) {
	if f.Aggregates < 1 || f.PayloadBytes < 2 || f.Marked < 0 || f.Pending < 0 {
		return "", nil, fmt.Errorf("statebench: fill: aggregates >= 1, payload >= 2 bytes, rows >= 0 (got %+v)", f)
	}
	prefix := f.prefix()
	at := any(nil) // now()
	if !f.At.IsZero() {
		at = f.At.UTC()
	}
	shardCount := f.Shards
	if shardCount == 0 {
		shardCount = ferry.DefaultShardCount
	}
	shards := make([]int32, f.Aggregates)
	for i := range shards {
		shards[i] = int32(ferry.ShardFor("bench", "order", prefix+strconv.Itoa(i), shardCount))
	}
	payload := []byte(`"` + strings.Repeat("x", f.PayloadBytes-2) + `"`)
	status := "'pending'"
	published, receipt := "NULL::timestamptz", "''"
	extraCol, extraVal := "", ""
	if f.MarkedStatus {
		status = "CASE WHEN g < $7 THEN 'sent' ELSE 'pending' END"
		published, receipt = "CASE WHEN g < $7 THEN coalesce($11::timestamptz, now()) END", "CASE WHEN g < $7 THEN 'bench' ELSE '' END"
	} else if f.MarkedColumn != "" {
		extraCol, extraVal = ", "+pgQuote(f.MarkedColumn), ", CASE WHEN g < $7 THEN coalesce($11::timestamptz, now()) END"
	}
	sql := fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type,
    schema_version, topic, shard, shard_count, content_type, payload, occurred_at, created_at, status, published_at, broker_receipt%s)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
    'bench', 'order', $10 || (g %% $1), g / $1 + 1, 'order.changed', 1, $2, ($3::int[])[g %% $1 + 1], $4, $5, $6, coalesce($11::timestamptz, now()), coalesce($11::timestamptz, now()),
    %s, %s, %s%s
FROM generate_series(0, $8::bigint - 1) g, LATERAL md5(g::text || $9) h
WHERE $7::bigint >= 0`, t.Name("outbox"), extraCol, status, published, receipt, extraVal)
	return sql, []any{f.Aggregates, f.Topic, shards, shardCount, ferry.DefaultContentType,
		payload, f.Marked, f.Marked + f.Pending, strconv.Itoa(len(prefix)) + prefix, prefix, at}, nil
}

// fillSequences writes the producer's per-aggregate sequence rows for the
// aggregates named prefix…, as the writer leaves them.
func fillSequences(ctx context.Context, db Execer, t ferry.Tables, prefix string) error {
	if _, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (tenant_id, aggregate_type, aggregate_id, last_seq)
SELECT tenant_id, aggregate_type, aggregate_id, max(aggregate_seq) FROM %s WHERE aggregate_id LIKE $1 || '%%' GROUP BY 1, 2, 3
ON CONFLICT (tenant_id, aggregate_type, aggregate_id) DO UPDATE SET last_seq = excluded.last_seq`, t.Name("aggregate_seq"), t.Name("outbox")), prefix); err != nil {
		return fmt.Errorf("statebench: pre-fill aggregate_seq: %w", err)
	}
	return nil
}

func pgQuote(ident string) string { return `"` + strings.ReplaceAll(ident, `"`, `""`) + `"` }
