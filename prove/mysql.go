package prove

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/ferryhq/ferry/driver"
	ferrymysql "github.com/ferryhq/ferry/driver/mysql"
)

// MySQL / MariaDB: everything prove does differently there is in this
// file. Each scenario gets its own database (CREATE DATABASE, dropped
// afterwards), the analogue of a Postgres schema.

func isMySQLURL(u string) bool { return strings.HasPrefix(u, "mysql://") }

// newMySQLDatabase creates the scenario's database on the stack's server.
func (st *stack) newMySQLDatabase(ctx context.Context, name string) (*database, error) {
	dbName := "ferry_prove_" + strings.ReplaceAll(name, "-", "_") + "_" + randHex(4)
	if len(dbName) > 60 { // MySQL names are at most 64 characters
		dbName = "ferry_prove_" + randHex(4)
	}
	admin, err := ferrymysql.Open(st.myURL)
	if err != nil {
		return nil, fmt.Errorf("prove: open mysql: %w", err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+dbName+"` CHARACTER SET utf8mb4 COLLATE "+ferrymysql.Collation); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("prove: create database: %w", err)
	}
	u, err := mysqlURLWithDatabase(st.myURL, dbName)
	if err != nil {
		_ = admin.Close()
		return nil, err
	}
	db, err := ferrymysql.Open(u)
	if err != nil {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE `"+dbName+"`")
		_ = admin.Close()
		return nil, fmt.Errorf("prove: open database %s: %w", dbName, err)
	}
	db.SetMaxOpenConns(16)
	d := &database{db: db, drv: ferrymysql.New(db), dialect: driver.MySQL, url: u, schema: dbName, adminURL: st.myURL}
	d.drop = func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+dbName+"`")
		_ = admin.Close()
	}
	return d, d.init(ctx)
}

// pingMySQL checks the server answers before any scenario starts.
func pingMySQL(ctx context.Context, u string) error {
	db, err := ferrymysql.Open(u)
	if err != nil {
		return fmt.Errorf("prove: open mysql: %w", err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("prove: connect mysql: %w", err)
	}
	return nil
}

// mysqlURLWithDatabase is raw (mysql://user:pass@host:port/db?…) naming
// database db instead.
func mysqlURLWithDatabase(raw, db string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("prove: mysql url: %w", err)
	}
	u.Path, u.RawPath = "/"+db, ""
	return u.String(), nil
}

// openMySQLProxied opens the scenario's database through the fault proxy
// at addr, for the relays' own pool.
func openMySQLProxied(raw, addr string) (*sql.DB, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("prove: mysql url: %w", err)
	}
	u.Host = addr
	q := u.Query()
	q.Set("timeout", "2s")
	u.RawQuery = q.Encode()
	return ferrymysql.Open(u.String())
}

// mysqlDDL turns the prove schema's portable DDL into MySQL's: keys must
// be bounded strings, and the row's keyed text columns stay within
// InnoDB's 3072-byte key limit at 4 bytes a character.
func mysqlDDL(ddl string) string {
	return strings.NewReplacer("{{AUTO}}", "BIGINT AUTO_INCREMENT PRIMARY KEY", "{{BLOB}}", "LONGBLOB", "TEXT", "VARCHAR(190)").Replace(ddl)
}

var (
	onConflictNothing = regexp.MustCompile(`\s*ON CONFLICT DO NOTHING`)
	onConflictUpdate  = regexp.MustCompile(`ON CONFLICT \([^)]*\) DO UPDATE SET`)
	excludedCol       = regexp.MustCompile(`excluded\.(\w+)`)
	castText          = regexp.MustCompile(`CAST\(([\w.]+) AS TEXT\)`)
	dollarParam       = regexp.MustCompile(`\$(\d+)`)
)

// sqlFor returns q, written for Postgres and SQLite, in dialect d: on
// MySQL, ON CONFLICT DO NOTHING becomes INSERT IGNORE (0 rows affected on
// a duplicate, like DO NOTHING), ON CONFLICT … DO UPDATE becomes ON
// DUPLICATE KEY UPDATE with VALUES(col) for excluded.col, and CAST(x AS
// TEXT) becomes x (MySQL stores uuids as text already).
func sqlFor(d driver.Dialect, q string) string {
	if d != driver.MySQL {
		return q
	}
	if onConflictNothing.MatchString(q) {
		q = strings.Replace(onConflictNothing.ReplaceAllString(q, ""), "INSERT INTO", "INSERT IGNORE INTO", 1)
	}
	q = onConflictUpdate.ReplaceAllString(q, "ON DUPLICATE KEY UPDATE")
	q = excludedCol.ReplaceAllString(q, "VALUES($1)")
	return castText.ReplaceAllString(q, "$1")
}

// rawSQL is q for a raw *sql.Tx of dialect d: Ferry's drivers rewrite $n
// for MySQL, the database/sql driver itself does not, so statements sent
// on the caller's own transaction get ? there. Each $n must appear once,
// in order.
func rawSQL(d driver.Dialect, q string) string {
	if d != driver.MySQL {
		return q
	}
	return dollarParam.ReplaceAllString(q, "?")
}

// fenceCheck locks shard's lease row in tx and returns 1 when owner still
// holds it at fence, 0 when it was taken over. Postgres and SQLite do it
// with a no-op UPDATE (its count is rows matched); MySQL counts only rows
// changed unless the connection asked for found rows, so it locks the row
// with SELECT … FOR UPDATE instead.
func fenceCheck(ctx context.Context, tx driver.Tx, shard int, owner string, fence int64) (int64, error) {
	if tx.Dialect() != driver.MySQL {
		return tx.Exec(ctx, `UPDATE prove_lease SET fence = fence WHERE shard = $1 AND owner = $2 AND fence = $3`, shard, owner, fence)
	}
	rows, err := tx.Query(ctx, `SELECT fence FROM prove_lease WHERE shard = $1 AND owner = $2 AND fence = $3 FOR UPDATE`, shard, owner, fence)
	if err != nil {
		return 0, err
	}
	var n int64
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}
