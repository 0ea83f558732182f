package console_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/console"
)

// BenchmarkConsoleScale: every list page, search and the overview over a
// 1,000,000-row outbox with 100,000 dead letters (Postgres), through the
// HTTP handlers. Each sub-benchmark reports p50 and p99 per request; run
// with a fixed count so the percentiles rest on enough requests:
//
//	go test -run '^$' -bench BenchmarkConsoleScale -benchtime 200x ./console/
//
// It also checks, from pg_stat_user_tables, that no page ran a sequential
// scan of the outbox (FERRY_SCALE_ROWS overrides the row count).
func BenchmarkConsoleScale(b *testing.B) {
	rows := 1_000_000
	if v := os.Getenv("FERRY_SCALE_ROWS"); v != "" {
		fmt.Sscan(v, &rows)
	}
	e := newScaleEnv(b, rows)
	pages := scalePages(b, e, rows)
	var seqScans []string
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			before := outboxSeqScans(b, e)
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				code, body, _ := call(b, e, "GET", p.path, viewerToken, nil)
				lat = append(lat, time.Since(t0))
				if code != 200 {
					b.Fatalf("%s: %d %s", p.path, code, body)
				}
			}
			slices.Sort(lat)
			pct := func(q float64) float64 {
				return float64(lat[min(len(lat)-1, int(float64(len(lat))*q))].Microseconds()) / 1000
			}
			b.ReportMetric(pct(0.50), "p50_ms")
			b.ReportMetric(pct(0.99), "p99_ms")
			b.ReportMetric(0, "ns/op")
			if n := outboxSeqScans(b, e) - before; n > 0 && p.name != "overview" {
				seqScans = append(seqScans, fmt.Sprintf("%s (%d)", p.name, n))
			}
			if pct(0.99) > 200 {
				b.Logf("%s: p99 %.1f ms is over the 200 ms budget", p.name, pct(0.99))
			}
		})
	}
	sort.Strings(seqScans)
	if len(seqScans) > 0 {
		b.Errorf("sequential scans of the outbox: %s", strings.Join(seqScans, ", "))
	}
	// The plans of the statements each page sent: no sequential scan of
	// the outbox.
	checkPagePlans(b, e, pages)
}

type scalePage struct{ name, path string }

// scalePages are the pages the scale benchmark and the plan test read:
// every list page (first, deep and filtered), the searches, the overview.
func scalePages(tb testing.TB, e *env, rows int) []scalePage {
	tb.Helper()
	ctx := context.Background()
	var mid, deadMid, someEvent string
	row := func(q string, dest *string) {
		if err := e.pg.Pool.QueryRow(ctx, q).Scan(dest); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	row(fmt.Sprintf(`SELECT (%d / 2)::text`, rows), &mid)
	row(fmt.Sprintf(`SELECT id::text FROM ferry_outbox WHERE status = 'dead' ORDER BY id OFFSET %d LIMIT 1`, rows/20), &deadMid)
	row(fmt.Sprintf(`SELECT event_id::text FROM ferry_outbox WHERE id = %d`, rows/3), &someEvent)
	since := url.QueryEscape(time.Now().Add(-time.Duration(rows/2) * time.Second).UTC().Format(time.RFC3339))
	until := url.QueryEscape(time.Now().Add(-time.Duration(rows/2-3600) * time.Second).UTC().Format(time.RFC3339))
	return []scalePage{
		{"overview", "/api/v1/status"},
		{"outbox_newest", "/api/v1/outbox?limit=50"},
		{"outbox_deep_page", "/api/v1/outbox?limit=50&after=" + mid},
		{"outbox_event_id", "/api/v1/outbox?event_id=" + someEvent},
		{"outbox_tenant", "/api/v1/outbox?tenant_id=tenant-7&limit=50"},
		{"outbox_tenant_deep", "/api/v1/outbox?tenant_id=tenant-7&limit=50&after=" + mid},
		{"outbox_aggregate", "/api/v1/outbox?tenant_id=tenant-3&aggregate_type=order&aggregate_id=o-5000&limit=50"},
		{"outbox_correlation", "/api/v1/outbox?correlation_id=corr-12345&limit=50"},
		{"outbox_status_dead", "/api/v1/outbox?status=dead&limit=50"},
		{"outbox_status_pending", "/api/v1/outbox?status=pending&limit=50"},
		{"outbox_time_range", "/api/v1/outbox?limit=50&since=" + since + "&until=" + until},
		{"dead_first_page", "/api/v1/dead?limit=50"},
		{"dead_deep_page", "/api/v1/dead?limit=50&after=" + deadMid},
		{"dead_by_topic", "/api/v1/dead?limit=50&topic=order.events"},
		{"dead_by_tenant", "/api/v1/dead?limit=50&tenant_id=tenant-10"},
		{"parked", "/api/v1/parked?limit=50"},
		{"effects_failed", "/api/v1/effects/failed?limit=50"},
		{"audit", "/api/v1/audit?limit=50"},
		{"audit_by_actor", "/api/v1/audit?limit=50&actor=olivia"},
		{"evidence", "/api/v1/evidence?q=" + someEvent},
	}
}

// outboxSeqScans reads the outbox's sequential-scan counter (statistics
// are flushed by backends at most once a second, hence the wait).
func outboxSeqScans(b testing.TB, e *env) int64 {
	b.Helper()
	time.Sleep(1100 * time.Millisecond)
	ctx := context.Background()
	conn, err := e.pg.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var n int64
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		b.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'ferry_outbox'`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// newScaleEnv fills a Postgres schema: rows outbox rows (10% dead, 0.1%
// pending, the rest sent; 50 tenants, 10 events per aggregate, 5 per
// correlation id, one a second back from now), 10,000 audit rows, 10,000
// open parked messages and 10,000 failed effect intents; then VACUUM
// ANALYZE (what autovacuum does in a running system: index-only scans
// rely on the visibility map).
func newScaleEnv(b testing.TB, rows int) *env {
	b.Helper()
	return newScaleEnvOn(b, "postgres", rows)
}

// newScaleEnvOn is newScaleEnv on "postgres" or "postgres-partitioned".
func newScaleEnvOn(b testing.TB, dialect string, rows int) *env {
	b.Helper()
	e := newEnv(b, dialect, console.Config{})
	ctx := context.Background()
	start := time.Now()
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO ferry_outbox (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
  topic, shard, shard_count, content_type, payload, occurred_at, created_at, correlation_id, status, attempts, last_error, published_at, broker_receipt)
SELECT gen_random_uuid(), 'tenant-' || (g %% 50), 'order', 'o-' || (g / 10), (g %% 10) + 1, 'order.created', 1,
  'order.events', g %% 8, 8, 'application/json', '\x7b7d'::bytea, now() - (%[1]d - g) * interval '1 second', now() - (%[1]d - g) * interval '1 second',
  'corr-' || (g / 5),
  CASE WHEN g %% 10 = 0 THEN 'dead' WHEN g %% 1000 = 1 THEN 'pending' ELSE 'sent' END,
  CASE WHEN g %% 10 = 0 THEN 5 ELSE 1 END,
  CASE WHEN g %% 10 = 0 THEN 'broker rejected: schema' ELSE '' END,
  CASE WHEN g %% 10 = 0 OR g %% 1000 = 1 THEN NULL ELSE now() END,
  CASE WHEN g %% 10 = 0 OR g %% 1000 = 1 THEN '' ELSE '{"seq":1}' END
FROM generate_series(1, %[1]d) g`, rows),
		`INSERT INTO ferry_ops_audit (at, actor, action, filter, row_count, reason, ids)
SELECT now() - g * interval '1 minute', CASE WHEN g % 2 = 0 THEN 'olivia' ELSE 'oscar' END, 'dlq.retry', '{}', 1, 'bench', '[]' FROM generate_series(1, 10000) g`,
		`INSERT INTO ferry_inbox_parked (consumer, reason, park_key, attempts, first_seen, last_seen, last_error, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type)
SELECT 'billing', 'schema', 'k-' || g, 1, now() - g * interval '1 second', now(), 'unknown schema version 3', 'tenant-1', 'order', 'o-' || g, 1, 'order.created' FROM generate_series(1, 10000) g`,
		`INSERT INTO ferry_effects (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha, state, attempts, next_attempt_at, last_error, created_at, updated_at, completed_at)
SELECT 'key-' || g, 'billing', gen_random_uuid(), 'charge', 'tenant-1', 'psp', 'charge', '\x7b7d'::bytea, '\x00'::bytea, 'failed', 3, now(), 'card declined', now() - g * interval '1 second', now(), now() FROM generate_series(1, 10000) g`,
		`VACUUM ANALYZE ferry_outbox, ferry_ops_audit, ferry_inbox_parked, ferry_effects`,
	} {
		if _, err := e.pg.Pool.Exec(ctx, q); err != nil {
			b.Fatalf("fill: %v\n%s", err, q)
		}
	}
	b.Logf("filled %d outbox rows (+ audit, parked, effects) in %s", rows, time.Since(start).Round(time.Millisecond))
	return e
}
