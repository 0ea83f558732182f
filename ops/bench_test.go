package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// fillPostgres writes n pending and n old sent rows straight into the outbox
// (generate_series: the point is the size, not the writer).
func fillPostgres(b *testing.B, e *env, n int) {
	b.Helper()
	for _, st := range []string{"pending", "sent"} {
		mustExec(b, e, fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at, created_at, status, published_at)
SELECT gen_random_uuid(), 'acme', 'order', '%s-' || i, 1, 'order.created', 1, 'topic-' || (i %% 8), i %% 16, 16, 'application/json', '\x7b7d',
    now() - interval '10 days', now() - interval '10 days', '%s', CASE WHEN '%s' = 'sent' THEN now() - interval '10 days' END
FROM generate_series(1, %d) i`, tn("outbox"), st, st, st, n))
	}
	mustExec(b, e, fmt.Sprintf(`ANALYZE %s`, tn("outbox")))
}

// BenchmarkStatusPostgres measures one Status snapshot (what every scrape
// of the collector and every `ferry status` costs) over 100k pending and
// 100k sent rows.
func BenchmarkStatusPostgres(b *testing.B) {
	e := newPostgresB(b)
	fillPostgres(b, e, 100_000)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := e.ops.Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Outbox.Pending != 100_000 {
			b.Fatalf("pending %d", st.Outbox.Pending)
		}
	}
}

// BenchmarkCleanupPostgres measures batched deletion of 100k sent rows
// (batch 500) and reports rows per second.
func BenchmarkCleanupPostgres(b *testing.B) {
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := newPostgresB(b)
		fillPostgres(b, e, 100_000)
		b.StartTimer()
		start := time.Now()
		res, err := e.ops.Cleanup(ctx, ops.CleanupOptions{Retention: 8 * 24 * time.Hour, BatchSize: 500}, approve)
		if err != nil {
			b.Fatal(err)
		}
		if res.Outbox != 100_000 {
			b.Fatalf("deleted %d", res.Outbox)
		}
		b.ReportMetric(float64(res.Outbox)/time.Since(start).Seconds(), "rows/s")
	}
}
