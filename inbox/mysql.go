package inbox

import (
	"fmt"

	"github.com/ferryhq/ferry"
)

// mysqlQueries replaces the statements whose Postgres/SQLite form MySQL 8
// and MariaDB 10.6+ reject. The claim runs as the SQLite path's several
// statements (claimSQLite), with the cursor row read FOR UPDATE: InnoDB
// serialises per row, not per database. Differences, all here:
//
//   - INSERT IGNORE instead of ON CONFLICT DO NOTHING for the claim row
//     (a concurrent claimer's uncommitted row makes it wait, then insert
//     nothing: claimed = false, retry);
//   - conditional upserts as ON DUPLICATE KEY UPDATE col = IF(cond, …):
//     MySQL assigns left to right, so updated_at is set before last_seq
//     (its condition reads the old last_seq); an unchanged row reports 0
//     affected rows (go-sql-driver without clientFoundRows), i.e. advanced
//     = false exactly as Postgres' WHERE;
//   - parking upserts on the open-row key (generated column open_park_key,
//     unique with consumer) and reads the id back (no RETURNING).
func mysqlQueries(q *queries, t ferry.Tables) {
	inbox, cursor, parked := t.Name("inbox"), t.Name("inbox_cursor"), t.Name("inbox_parked")
	q.sqliteCursor = fmt.Sprintf(`SELECT last_seq FROM %s WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4 FOR UPDATE`, cursor)
	q.sqliteInsertClaim = fmt.Sprintf(`INSERT IGNORE INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, inbox)
	q.sqliteAdvance = fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON DUPLICATE KEY UPDATE updated_at = IF(last_seq = VALUES(last_seq) - 1, VALUES(updated_at), updated_at),
    last_seq = IF(last_seq = VALUES(last_seq) - 1, VALUES(last_seq), last_seq)`, cursor)
	q.setCursor = fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON DUPLICATE KEY UPDATE updated_at = IF(last_seq < VALUES(last_seq), VALUES(updated_at), updated_at),
    last_seq = IF(last_seq < VALUES(last_seq), VALUES(last_seq), last_seq)`, cursor)
	q.park = fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, attempts, first_seen, last_seen, last_error,
    tenant_id, event_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version, content_type, payload,
    occurred_at, topic, traceparent, correlation_id, causation_id, principal, action, target,
    fingerprint, other_fingerprint, raw_destination, raw_key, raw_headers, raw_body)
VALUES ($1, $2, $3, $4, $5, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23,
    $24, $25, $26, $27, $28, $29)
ON DUPLICATE KEY UPDATE reason = VALUES(reason), attempts = attempts + 1, last_seen = VALUES(last_seen),
    last_error = VALUES(last_error), other_fingerprint = VALUES(other_fingerprint)`, parked)
	q.parkReadBack = fmt.Sprintf(`SELECT id FROM %s WHERE consumer = $1 AND park_key = $3 AND resolved_at IS NULL`, parked)
}
