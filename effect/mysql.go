package effect

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// MySQL 8 / MariaDB 10.6+: the statements whose Postgres/SQLite form MySQL
// rejects, all here.
//
//   - INSERT IGNORE instead of ON CONFLICT (idem_key) DO NOTHING;
//   - the claim has no RETURNING, and MySQL allows neither LIMIT in an IN
//     subquery nor a subquery on the table being updated: the worker picks
//     due ids, updates those still due (the conditional UPDATE re-checks
//     each row under its row lock, so two workers never both take one)
//     with its unique lease owner, and reads back the rows carrying that
//     owner. The assignments keep Postgres' order: MySQL assigns left to
//     right, and state is set last because the others read it.
func mysqlStatements(st *statements, n string) {
	st.insert = strings.Replace(st.insert, "INSERT INTO", "INSERT IGNORE INTO", 1)
	st.insert = strings.Replace(st.insert, " ON CONFLICT (idem_key) DO NOTHING", "", 1)
	due := `((state IN ('pending', 'unknown') AND next_attempt_at <= $3 AND (lease_until IS NULL OR lease_until < $3))
       OR (state = 'in_flight' AND lease_until < $3))`
	st.mysqlPick = fmt.Sprintf(`SELECT id FROM %s WHERE %s%s ORDER BY next_attempt_at, id LIMIT $4`, n, due, skipTargets)
	st.claim = fmt.Sprintf(`UPDATE %s SET lease_owner = $1, lease_until = $2, updated_at = $3,
    last_error = CASE WHEN state = 'in_flight' THEN 'lease expired while in flight (worker died mid-call?)' ELSE last_error END,
    unknown_since = CASE WHEN state = 'in_flight' THEN $3 ELSE unknown_since END,
    state = CASE WHEN state = 'in_flight' THEN 'unknown' ELSE state END
WHERE id IN ({{ids}}) AND %s`, n, due)
	st.mysqlReadBack = fmt.Sprintf(`SELECT id, idem_key, consumer, CAST(event_id AS CHAR), step, tenant_id, target, operation, request, state, attempts, reconciliations
FROM %s WHERE id IN ({{ids}}) AND lease_owner = $1 ORDER BY next_attempt_at, id`, n)
}

// claimMySQL is the claim's MySQL form; it returns the claimed rows' query
// and arguments for the common scan, or "" when nothing was due.
func (w *Worker) claimMySQL(ctx context.Context, skip []string, args ...any) (string, error) {
	exec := w.db.Executor()
	rows, err := exec.Query(ctx, claimSkipping(w.sql.mysqlPick, skip), args...)
	if err != nil {
		return "", err
	}
	var ids []string
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return "", err
		}
		ids = append(ids, strconv.FormatInt(id, 10))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	if len(ids) == 0 {
		return "", nil
	}
	list := strings.Join(ids, ", ")
	if _, err := exec.Exec(ctx, strings.Replace(w.sql.claim, "{{ids}}", list, 1), args...); err != nil {
		return "", err
	}
	return strings.Replace(w.sql.mysqlReadBack, "{{ids}}", list, 1), nil
}
