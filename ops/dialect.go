package ops

import (
	"context"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/driver"
)

// The SQL that differs between Postgres, SQLite and MySQL/MariaDB lives
// here; every other file of the package writes one statement for all.
// MySQL 8 and MariaDB 10.6+ get the same text: no RETURNING (MySQL 8 lacks
// it), no ON CONFLICT, no || for concatenation, no LIMIT in an IN
// subquery, and information_schema scoped to DATABASE().

func (o *Ops) pg() bool { return o.db.Dialect() == driver.Postgres }

func (o *Ops) mysql() bool { return o.db.Dialect() == driver.MySQL }

func (o *Ops) sqlite() bool { return o.db.Dialect() == driver.SQLite }

// rowLocks reports whether SELECT … FOR UPDATE takes row locks (Postgres,
// MySQL). SQLite has none: its write lock (BEGIN IMMEDIATE) serialises
// the action against the relay instead.
func (o *Ops) rowLocks() bool { return o.pg() || o.mysql() }

// uuidText selects a uuid column as text on every dialect (MySQL and
// SQLite store it as text already).
func (o *Ops) uuidText(col string) string {
	if o.pg() {
		return col + "::text"
	}
	return col
}

// payloadSize is the byte length of the payload column.
func (o *Ops) payloadSize() string {
	if o.pg() || o.mysql() {
		return "octet_length(payload)"
	}
	return "length(payload)"
}

// containsText matches col containing the argument literally (% and _
// mean themselves), for a where clause with one ? placeholder.
func (o *Ops) containsText(col string) string {
	if o.pg() {
		return "strpos(" + col + ", ?) > 0"
	}
	return "instr(" + col + ", ?) > 0" // SQLite and MySQL: instr(str, substr)
}

// prefixText is "? || col" (the argument put in front of col's value) with
// a ? placeholder.
func (o *Ops) prefixText(col string) string {
	if o.mysql() {
		return "CONCAT(?, " + col + ")"
	}
	return "? || " + col
}

// schemaScope is the information_schema condition selecting Ferry's schema
// (Postgres) or database (MySQL) with the placeholder number n, and the
// arguments it adds.
func (o *Ops) schemaScope(n int) (string, []any) {
	if o.cfg.tables.Schema != "" {
		return fmt.Sprintf("table_schema = $%d", n), []any{o.cfg.tables.Schema}
	}
	if o.mysql() {
		return "table_schema = DATABASE()", nil
	}
	return "table_schema = current_schema()", nil
}

// tableExists reports whether Ferry table base is installed.
func (o *Ops) tableExists(ctx context.Context, exec driver.Executor, base string) (bool, error) {
	var q string
	var args []any
	if o.pg() || o.mysql() {
		scope, sargs := o.schemaScope(1)
		args = append(sargs, o.cfg.tables.Bare(base))
		q = fmt.Sprintf(`SELECT count(*) FROM information_schema.tables WHERE %s AND table_name = $%d`, scope, len(args))
	} else {
		q = `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1`
		args = []any{o.cfg.tables.Bare(base)}
	}
	var n int64
	if err := queryRow(ctx, exec, q, args, &n); err != nil {
		return false, fmt.Errorf("ops: look up table %s: %w", base, err)
	}
	return n > 0, nil
}

// columnExists reports whether table base has column col.
func (o *Ops) columnExists(ctx context.Context, exec driver.Executor, base, col string) (bool, error) {
	var q string
	var args []any
	if o.pg() || o.mysql() {
		scope, sargs := o.schemaScope(1)
		args = append(sargs, o.cfg.tables.Bare(base), col)
		q = fmt.Sprintf(`SELECT count(*) FROM information_schema.columns WHERE %s AND table_name = $%d AND column_name = $%d`,
			scope, len(args)-1, len(args))
	} else {
		q = `SELECT count(*) FROM pragma_table_info($1) WHERE name = $2`
		args = []any{o.cfg.tables.Bare(base), col}
	}
	var n int64
	if err := queryRow(ctx, exec, q, args, &n); err != nil {
		return false, fmt.Errorf("ops: look up column %s.%s: %w", base, col, err)
	}
	return n > 0, nil
}

// installedTablesSQL lists which of the tables named by the placeholders
// ph exist; scope comes from schemaScope(1) (its arguments first).
func (o *Ops) installedTablesSQL(scope string, ph []string) string {
	if o.pg() || o.mysql() {
		return fmt.Sprintf(`SELECT table_name FROM information_schema.tables WHERE %s AND table_name IN (%s)`, scope, strings.Join(ph, ", "))
	}
	return fmt.Sprintf(`SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%s)`, strings.Join(ph, ", "))
}

// insertID runs an INSERT q (without RETURNING) inside tx and returns the
// new row's id. Postgres and SQLite append RETURNING id; MySQL 8 has no
// RETURNING, so it reads LAST_INSERT_ID() on the same connection (the
// transaction's), which is per-connection and therefore race-free.
func (o *Ops) insertID(ctx context.Context, tx driver.Executor, q string, args []any) (int64, error) {
	var id int64
	if !o.mysql() {
		err := queryRow(ctx, tx, q+" RETURNING id", args, &id)
		return id, err
	}
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return 0, err
	}
	err := queryRow(ctx, tx, `SELECT LAST_INSERT_ID()`, nil, &id)
	return id, err
}

// upsertSetting is the statement writing one ops_settings row ($1 name,
// $2 value_seconds, $3 updated_at).
func (o *Ops) upsertSetting() string {
	if o.mysql() {
		// VALUES() rather than the 8.0.19 row alias: MariaDB has no alias.
		return fmt.Sprintf(`INSERT INTO %s (name, value_seconds, updated_at) VALUES ($1, $2, $3)
ON DUPLICATE KEY UPDATE value_seconds = VALUES(value_seconds), updated_at = VALUES(updated_at)`, o.t("ops_settings"))
	}
	return fmt.Sprintf(`INSERT INTO %s (name, value_seconds, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET value_seconds = excluded.value_seconds, updated_at = excluded.updated_at`, o.t("ops_settings"))
}

// cleanupDelete is the statement deleting one batch of t's rows.
func (o *Ops) cleanupDelete(t cleanupTarget, batch int) string {
	if o.mysql() {
		// MySQL refuses LIMIT inside IN (…) and a subquery on the table
		// being deleted from; a single-table DELETE takes LIMIT itself. It
		// waits on (rather than skips) a row another transaction locked,
		// at most innodb_lock_wait_timeout.
		return fmt.Sprintf(`DELETE FROM %s WHERE %s LIMIT %d`, o.t(t.table), t.cond, batch)
	}
	lock := ""
	if o.pg() {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	sel := t.sel
	if sel == "" {
		sel = t.key
	}
	return fmt.Sprintf(`DELETE FROM %[1]s WHERE %[2]s IN (SELECT %[6]s FROM %[1]s WHERE %[3]s LIMIT %[4]d%[5]s)`,
		o.t(t.table), t.key, t.cond, batch, lock, sel)
}
