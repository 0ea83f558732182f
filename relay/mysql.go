package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry"
)

// MySQL 8 / MariaDB 10.6+: every statement that differs from the Postgres
// form lives here. The differences:
//
//   - no RETURNING on UPDATE (MySQL 8 has none): a lease statement is an
//     UPDATE and a read-back of the rows it changed, in one transaction
//     (the UPDATE's row locks keep the read-back exact); acquire first picks
//     free shards with SELECT … FOR UPDATE SKIP LOCKED, since MySQL allows
//     neither LIMIT in an IN subquery nor a subquery on the updated table;
//   - ON DUPLICATE KEY UPDATE for upserts, a digits cross join instead of a
//     recursive CTE (cte_max_recursion_depth is 1000 on MySQL 8);
//   - marks join JSON_TABLE (both servers have it) in a multi-table UPDATE;
//   - the database clock is NOW(6) (DATETIME(6), sessions in UTC);
//   - no NOTIFY: the worker polls, Relay.Notify() wakes it in process.
//
// Time columns are DATETIME(6) in UTC (driver/mysql sets time_zone).

const mysqlNow = "NOW(6)"

func mysqlPlus(secs string) string {
	return "DATE_ADD(NOW(6), INTERVAL ROUND((" + secs + ") * 1000000) MICROSECOND)"
}

// mysqlRowsOf reads a JSON array parameter as rows.
func mysqlRowsOf(p string, cols ...string) string {
	types := map[string]string{"id": "BIGINT", "fence": "BIGINT", "receipt": "TEXT", "delay": "DOUBLE",
		"dead": "VARCHAR(5)", "err": "TEXT", "charge": "INT"}
	defs := make([]string, len(cols))
	for i, c := range cols {
		defs[i] = fmt.Sprintf("%s %s PATH '$.%s'", c, types[c], c)
	}
	return fmt.Sprintf("JSON_TABLE(%s, '$[*]' COLUMNS (%s)) AS m", p, strings.Join(defs, ", "))
}

// mysqlLease is one lease statement in MySQL form: optionally a pick of
// free shards, the UPDATE, and the read-back of (shard, fence).
type mysqlLease struct {
	pick     string // acquire only: the shards to take, locked, skipping locked ones
	update   string // with {{shards}} for the picked list when pick is set
	readBack string
}

// mysqlQueries replaces the statements whose Postgres form MySQL rejects.
func mysqlQueries(q *queries, t ferry.Tables, now string, plus func(string) string, fence string) {
	outbox, leases, inst := t.Name("outbox"), t.Name("relay_leases"), t.Name("relay_instances")
	schema := "DATABASE()"
	if t.Schema != "" {
		schema = "'" + t.Schema + "'"
	}
	q.hasDiscarded = fmt.Sprintf(`SELECT count(*) FROM information_schema.columns
WHERE table_name = '%s' AND column_name = 'discarded_at' AND table_schema = %s`, t.Bare("outbox"), schema)
	digits := "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	q.ensureLeases = fmt.Sprintf(`INSERT INTO %[1]s (shard)
SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d FROM %[2]s a CROSS JOIN %[2]s b CROSS JOIN %[2]s c CROSS JOIN %[2]s e
WHERE a.d + 10 * b.d + 100 * c.d + 1000 * e.d < $1
ON DUPLICATE KEY UPDATE shard = shard`, leases, digits)
	q.heartbeat = fmt.Sprintf(`INSERT INTO %s (instance_id, shard_count, heartbeat_at, expires_at, breaker) VALUES ($1, $2, %s, %s, $4)
ON DUPLICATE KEY UPDATE shard_count = VALUES(shard_count), heartbeat_at = VALUES(heartbeat_at), expires_at = VALUES(expires_at), breaker = VALUES(breaker)`,
		inst, now, plus("$3"))

	// Lease statements: q.renew/adopt/acquire hold the UPDATE (a key for
	// mysqlLeases); leaseRows runs the whole mysqlLease.
	q.renew = fmt.Sprintf(`UPDATE %s SET expires_at = %s WHERE owner = $1 AND expires_at > %s AND shard < $3`, leases, plus("$2"), now)
	q.adopt = fmt.Sprintf(`UPDATE %s SET fence = fence + 1, expires_at = %s WHERE owner = $1 AND shard < $3`, leases, plus("$2"))
	q.acquire = fmt.Sprintf(`UPDATE %s SET owner = $1, fence = fence + 1, expires_at = %s WHERE shard IN ({{shards}}) AND expires_at <= %s`,
		leases, plus("$2"), now)
	q.mysqlLeases = map[string]mysqlLease{
		q.renew: {update: q.renew,
			readBack: fmt.Sprintf(`SELECT shard, fence FROM %s WHERE owner = $1 AND expires_at > %s AND shard < $3`, leases, now)},
		q.adopt: {update: q.adopt,
			readBack: fmt.Sprintf(`SELECT shard, fence FROM %s WHERE owner = $1 AND shard < $3`, leases)},
		q.acquire: {
			pick: fmt.Sprintf(`SELECT shard FROM %s WHERE expires_at <= %s AND shard < $4 ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED`,
				leases, now),
			update:   q.acquire,
			readBack: fmt.Sprintf(`SELECT shard, fence FROM %s WHERE owner = $1 AND shard IN ({{shards}})`, leases),
		},
	}

	q.markSent = fmt.Sprintf(`UPDATE %[3]s STRAIGHT_JOIN %[1]s ON %[1]s.id = m.id
SET %[1]s.status = 'sent', %[1]s.published_at = %[2]s, %[1]s.broker_receipt = m.receipt
WHERE %[1]s.status = 'pending' AND %[4]s`,
		outbox, now, mysqlRowsOf("$2", "id", "fence", "receipt"), fence)
	// MySQL assigns left to right and later assignments see earlier ones:
	// attempts first is fine, nothing after it reads attempts.
	q.markFailed = fmt.Sprintf(`UPDATE %[3]s STRAIGHT_JOIN %[1]s ON %[1]s.id = m.id
SET %[1]s.attempts = %[1]s.attempts + m.charge,
    %[1]s.status = CASE WHEN m.dead = 'true' THEN 'dead' ELSE 'pending' END,
    %[1]s.next_attempt_at = %[2]s, %[1]s.last_error = m.err
WHERE %[1]s.status = 'pending' AND %[4]s`,
		outbox, plus("m.delay"), mysqlRowsOf("$2", "id", "fence", "delay", "dead", "err", "charge"), fence)
}

// mysqlLeaseRows runs a lease statement's MySQL form in one transaction
// and returns the (shard, fence) rows it changed.
func (r *Relay) mysqlLeaseRows(ctx context.Context, stmt string, args ...any) (map[int]int64, error) {
	l, ok := r.q.mysqlLeases[stmt]
	if !ok {
		return nil, fmt.Errorf("relay: no MySQL form of lease statement %.40q", stmt)
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	update, readBack := l.update, l.readBack
	if l.pick != "" {
		rows, err := tx.Query(ctx, l.pick, args...)
		if err != nil {
			return nil, err
		}
		var picked []string
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return nil, err
			}
			picked = append(picked, strconv.FormatInt(s, 10))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if len(picked) == 0 {
			return map[int]int64{}, tx.Commit(ctx)
		}
		list := strings.Join(picked, ", ")
		update = strings.Replace(update, "{{shards}}", list, 1)
		readBack = strings.Replace(readBack, "{{shards}}", list, 1)
	}
	if _, err := tx.Exec(ctx, update, args...); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, readBack, args...)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for rows.Next() {
		var s, f int64
		if err := rows.Scan(&s, &f); err != nil {
			rows.Close()
			return nil, err
		}
		out[int(s)] = f
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, tx.Commit(ctx)
}
