package inbox

import (
	"fmt"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// queries holds the statements of one dialect, rendered once for the
// configured table names.
type queries struct {
	dialect driver.Dialect
	// claimPG is the whole live-path check in one Postgres round trip.
	claimPG string
	// SQLite has no data-modifying CTEs; its writers are serialised by the
	// database lock, so the claim runs as several statements (function
	// calls, not network round trips).
	sqlitePrev, sqliteCursor, sqliteInsertClaim, sqliteAdvance, sqliteHasSucc string

	park, resolve, touch           string
	selectParked, nextGap, healIDs string
	setCursor, cursorOf            string
	parkedStats, gapAggregates     string
	fingerprintOf                  string
	parkReadBack                   string // MySQL: the open park row's id (no RETURNING)
	bulkRead, bulkWrite            string // Postgres batch pass (bulk.go)
}

const parkedCols = `id, consumer, reason, attempts, first_seen, last_seen, last_error, resolved_at, resolution,
    tenant_id, %s, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version, content_type, payload,
    occurred_at, topic, traceparent, correlation_id, causation_id, principal, action, target,
    fingerprint, other_fingerprint, raw_destination, raw_key, raw_headers, raw_body`

func newQueries(d driver.Dialect, t ferry.Tables) (*queries, error) {
	q := &queries{dialect: d}
	inbox, cursor, parked := t.Name("inbox"), t.Name("inbox_cursor"), t.Name("inbox_parked")
	var eventIDCol, eventIDParam, lockCursor string
	switch d {
	case driver.Postgres:
		eventIDCol, eventIDParam, lockCursor = "event_id::text", "$%d::uuid", " FOR UPDATE"
	case driver.SQLite:
		eventIDCol, eventIDParam, lockCursor = "event_id", "$%d", ""
	case driver.MySQL:
		eventIDCol, eventIDParam, lockCursor = "event_id", "$%d", " FOR UPDATE"
	default:
		return nil, &ferry.ConfigError{Field: "dialect", Reason: fmt.Sprintf("unsupported dialect %q", d)}
	}
	cols := fmt.Sprintf(parkedCols, eventIDCol)

	// The claim: dedup check, cursor check under the cursor's row lock,
	// conditional claim insert and conditional cursor advance, plus "is a
	// parked successor waiting?" — one round trip. $8 ordering, $9 accept
	// any first sequence. The cursor advance only happens if the claim row
	// was inserted (a concurrent claimer that won leaves claimed = 0) and
	// only if the cursor still stands right before seq (a concurrent
	// applier that won leaves advanced = 0); both mean "retry".
	q.claimPG = fmt.Sprintf(`WITH prev AS (
    SELECT fingerprint FROM %[1]s WHERE consumer = $1 AND tenant_id = $2 AND event_id = $3::uuid
), cur AS (
    SELECT last_seq FROM %[2]s
    WHERE $8::bool AND consumer = $1 AND tenant_id = $2 AND aggregate_type = $4 AND aggregate_id = $5
    FOR UPDATE
), d AS (
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM prev) THEN
            CASE WHEN (SELECT fingerprint FROM prev) = $7::bytea THEN 'duplicate' ELSE 'collision' END
        WHEN NOT $8::bool THEN 'apply'
        WHEN NOT EXISTS (SELECT 1 FROM cur) THEN
            CASE WHEN $6::bigint = 1 OR $9::bool THEN 'apply' ELSE 'gap' END
        WHEN $6::bigint <= (SELECT last_seq FROM cur) THEN 'stale'
        WHEN $6::bigint = (SELECT last_seq FROM cur) + 1 THEN 'apply'
        ELSE 'gap'
    END AS decision
), claim AS (
    INSERT INTO %[1]s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
    SELECT $1, $2, $3::uuid, $7::bytea, $4, $5, $6::bigint, $10, $11::timestamptz FROM d WHERE decision = 'apply'
    ON CONFLICT DO NOTHING
    RETURNING 1
), adv AS (
    INSERT INTO %[2]s AS c (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
    SELECT $1, $2, $4, $5, $6::bigint, $11::timestamptz FROM claim WHERE $8::bool
    ON CONFLICT (consumer, tenant_id, aggregate_type, aggregate_id)
    DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
    WHERE c.last_seq = excluded.last_seq - 1
    RETURNING 1
)
SELECT d.decision,
    COALESCE((SELECT fingerprint FROM prev), '\x'::bytea),
    COALESCE((SELECT last_seq FROM cur), -1),
    (SELECT count(*) FROM claim),
    (SELECT count(*) FROM adv),
    $8::bool AND d.decision = 'apply' AND EXISTS (
        SELECT 1 FROM %[3]s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $4 AND aggregate_id = $5
        AND reason = 'gap' AND resolved_at IS NULL AND aggregate_seq = $6::bigint + 1)
FROM d`, inbox, cursor, parked)

	q.sqlitePrev = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND tenant_id = $2 AND event_id = $3`, inbox)
	q.sqliteCursor = fmt.Sprintf(`SELECT last_seq FROM %s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4`, cursor)
	q.sqliteInsertClaim = fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`, inbox)
	q.sqliteAdvance = fmt.Sprintf(`INSERT INTO %[1]s (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, tenant_id, aggregate_type, aggregate_id)
DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
WHERE %[1]s.last_seq = excluded.last_seq - 1`, cursor)
	q.sqliteHasSucc = fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3
AND aggregate_id = $4 AND reason = 'gap' AND resolved_at IS NULL AND aggregate_seq = $5)`, parked)

	// Parking is an upsert on the open row of the same message: a
	// redelivered or replayed message bumps attempts and last_seen and
	// takes the latest reason, never a second row.
	q.park = fmt.Sprintf(`INSERT INTO %[1]s AS p (consumer, reason, park_key, attempts, first_seen, last_seen, last_error,
    tenant_id, event_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version, content_type, payload,
    occurred_at, topic, traceparent, correlation_id, causation_id, principal, action, target,
    fingerprint, other_fingerprint, raw_destination, raw_key, raw_headers, raw_body)
VALUES ($1, $2, $3, $4, $5, $5, $6, $7, %[2]s, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23,
    $24, $25, $26, $27, $28, $29)
ON CONFLICT (consumer, park_key) WHERE resolved_at IS NULL
DO UPDATE SET reason = excluded.reason, attempts = p.attempts + 1, last_seen = excluded.last_seen,
    last_error = excluded.last_error, other_fingerprint = excluded.other_fingerprint
RETURNING id`, parked, fmt.Sprintf(eventIDParam, 8))
	q.resolve = fmt.Sprintf(`UPDATE %s SET resolved_at = $3, resolution = $4, last_seen = $3 WHERE consumer = $1 AND id = $2 AND resolved_at IS NULL`, parked)
	q.touch = fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_seen = $3, last_error = $4 WHERE consumer = $1 AND id = $2`, parked)
	q.selectParked = fmt.Sprintf(`SELECT %s FROM %s WHERE consumer = $1 AND id = $2%s`, cols, parked, lockCursor)
	q.nextGap = fmt.Sprintf(`SELECT %s FROM %s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4
AND reason = 'gap' AND resolved_at IS NULL ORDER BY aggregate_seq LIMIT 1`, cols, parked)
	q.healIDs = fmt.Sprintf(`SELECT p.id FROM %s p JOIN %s c ON c.consumer = p.consumer AND c.tenant_id = p.tenant_id
    AND c.aggregate_type = p.aggregate_type AND c.aggregate_id = p.aggregate_id
WHERE p.consumer = $1 AND p.reason = 'gap' AND p.resolved_at IS NULL AND p.aggregate_seq <= c.last_seq + 1
ORDER BY p.aggregate_seq LIMIT $2`, parked, cursor)
	q.cursorOf = fmt.Sprintf(`SELECT last_seq FROM %s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4%s`, cursor, lockCursor)
	q.setCursor = fmt.Sprintf(`INSERT INTO %[1]s AS c (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, tenant_id, aggregate_type, aggregate_id)
DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at WHERE c.last_seq < excluded.last_seq`, cursor)
	q.parkedStats = fmt.Sprintf(`SELECT reason, count(*), min(first_seen), sum(CASE WHEN first_seen < $2 THEN 1 ELSE 0 END)
FROM %s WHERE consumer = $1 AND resolved_at IS NULL GROUP BY reason`, parked)
	q.gapAggregates = fmt.Sprintf(`SELECT count(*) FROM (SELECT DISTINCT tenant_id, aggregate_type, aggregate_id FROM %s
WHERE consumer = $1 AND reason = 'gap' AND resolved_at IS NULL) g`, parked)
	q.fingerprintOf = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND tenant_id = $2 AND event_id = %s`, inbox, fmt.Sprintf(eventIDParam, 3))
	if d == driver.MySQL {
		mysqlQueries(q, t)
	}
	if d == driver.Postgres {
		q.bulkRead = bulkReadSQL(inbox, cursor)
		q.bulkWrite = bulkWriteSQL(inbox, cursor, parked)
	}
	return q, nil
}

// listParked renders the ListParked query for a filter.
func (q *queries) listParked(t ferry.Tables, f ParkedFilter) (string, []any) {
	eventIDCol := "event_id::text"
	if q.dialect != driver.Postgres {
		eventIDCol = "event_id"
	}
	args := []any{f.consumer, f.AfterID}
	where := "consumer = $1 AND id > $2"
	if !f.IncludeResolved {
		where += " AND resolved_at IS NULL"
	}
	if f.Reason != "" {
		args = append(args, string(f.Reason))
		where += fmt.Sprintf(" AND reason = $%d", len(args))
	}
	if f.TenantID != "" {
		args = append(args, f.TenantID)
		where += fmt.Sprintf(" AND tenant_id = $%d", len(args))
	}
	args = append(args, f.Limit)
	return fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY id LIMIT $%d`,
		fmt.Sprintf(parkedCols, eventIDCol), t.Name("inbox_parked"), where, len(args)), args
}
