// Package mysql is Ferry's MySQL 8 / MariaDB 10.6+ driver: [Open] opens a
// database with the session settings Ferry relies on (through
// github.com/go-sql-driver/mysql) and [New] builds the database/sql driver
// over it. It is its own package so services on Postgres or SQLite do not
// link a MySQL client.
//
// Session settings forced by Open (on every connection of the pool):
//
//   - parseTime=true, loc=UTC and time_zone '+00:00': Ferry's DATETIME(6)
//     columns hold UTC, and NOW() / CURRENT_TIMESTAMP defaults are UTC.
//   - charset utf8mb4 (collation utf8mb4_unicode_ci, present on MySQL 8 and
//     MariaDB).
//   - sql_mode with STRICT_TRANS_TABLES (over-long or invalid values fail
//     instead of being truncated) and NO_ENGINE_SUBSTITUTION.
//   - READ COMMITTED isolation. REPEATABLE READ (InnoDB's default) takes
//     next-key (gap) locks on every locking read and SKIP LOCKED scan, so
//     the relay's claim and the producers inserting new aggregates' rows
//     would block and deadlock on each other's gaps; READ COMMITTED locks
//     only the rows a statement touches. Ferry's correctness does not
//     depend on snapshot reads: the producer's per-aggregate sequence is
//     serialised by a row lock, which InnoDB takes at either level. A caller
//     transaction at REPEATABLE READ still works (see docs/MYSQL.md).
//   - interpolateParams=true unless the URL says otherwise: one round trip
//     per statement instead of prepare/execute/close (safe with utf8mb4).
//
// Errors: a duplicate key (1062) becomes a *driver.UniqueViolationError
// naming the key and the duplicate entry; a deadlock (1213) wraps
// driver.ErrDeadlock and a lock wait timeout (1205) wraps
// driver.ErrLockTimeout, both keeping the *mysql.MySQLError reachable with
// errors.As.
package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
)

// Isolation is the transaction isolation level Open sets on every
// connection.
const Isolation = "READ COMMITTED"

// SQLMode is the sql_mode Open sets on every connection.
const SQLMode = "STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"

// Collation is the connection collation Open sets (utf8mb4).
const Collation = "utf8mb4_unicode_ci"

// MySQL error numbers the driver maps.
const (
	ErDupEntry        = 1062 // ER_DUP_ENTRY
	ErLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	ErLockDeadlock    = 1213 // ER_LOCK_DEADLOCK
)

// ParseURL turns a database URL into the go-sql-driver configuration Open
// uses, with Ferry's settings applied. It accepts
//
//	mysql://user:password@host:port/database?param=value…
//	user:password@tcp(host:port)/database?param=value…   (the driver's DSN)
//
// The database is required (Ferry's tables live in it). Parameters are
// the driver's (tls, timeout, readTimeout, …); parseTime, loc, time_zone,
// charset and collation may be given only with the values Ferry needs.
func ParseURL(raw string) (*gomysql.Config, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, errors.New("mysql: database url is empty (want mysql://user:pass@host:port/db)")
	}
	var cfg *gomysql.Config
	if strings.HasPrefix(raw, "mysql://") || strings.HasPrefix(raw, "mariadb://") {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("mysql: database url: %w", redactErr(err, raw))
		}
		if u.Host == "" {
			return nil, errors.New("mysql: database url has no host (want mysql://user:pass@host:port/db)")
		}
		host, port := u.Hostname(), u.Port()
		if host == "" {
			return nil, errors.New("mysql: database url has no host name")
		}
		if port == "" {
			port = "3306"
		}
		if cfg, err = gomysql.ParseDSN("/?" + u.RawQuery); err != nil {
			return nil, fmt.Errorf("mysql: database url parameters: %w", err)
		}
		cfg.Net = "tcp"
		cfg.Addr = net.JoinHostPort(host, port)
		if u.User != nil {
			cfg.User = u.User.Username()
			cfg.Passwd, _ = u.User.Password()
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		if strings.Contains(cfg.DBName, "/") {
			return nil, fmt.Errorf("mysql: database url path %q: want one database name", u.Path)
		}
	} else {
		if strings.Contains(raw, "://") {
			return nil, fmt.Errorf("mysql: database url scheme %q not supported (want mysql:// or the driver's DSN user:pass@tcp(host:port)/db)", raw[:strings.Index(raw, "://")])
		}
		var err error
		if cfg, err = gomysql.ParseDSN(raw); err != nil {
			return nil, fmt.Errorf("mysql: database DSN: %w", redactErr(err, raw))
		}
	}
	if cfg.DBName == "" {
		return nil, errors.New("mysql: database url names no database (want …/dbname)")
	}
	if err := checkParams(rawParams(raw)); err != nil {
		return nil, err
	}
	if err := applySettings(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// applySettings checks the parameters a user gave against the settings
// Ferry needs, then forces them.
func applySettings(cfg *gomysql.Config) error {
	if cfg.Loc != nil && cfg.Loc != time.UTC && cfg.Loc.String() != "UTC" {
		return fmt.Errorf("mysql: parameter loc=%s: Ferry needs loc=UTC", cfg.Loc)
	}
	for k, v := range cfg.Params {
		switch strings.ToLower(k) {
		case "time_zone":
			if tz := strings.Trim(v, "'\""); tz != "+00:00" && !strings.EqualFold(tz, "UTC") {
				return fmt.Errorf("mysql: parameter time_zone=%s: Ferry needs time_zone='+00:00'", v)
			}
			delete(cfg.Params, k)
		case "charset":
			if !strings.HasPrefix(strings.ToLower(v), "utf8mb4") {
				return fmt.Errorf("mysql: parameter charset=%s: Ferry needs utf8mb4", v)
			}
			delete(cfg.Params, k)
		case "sql_mode", "transaction_isolation", "tx_isolation", "autocommit":
			return fmt.Errorf("mysql: parameter %s: Ferry sets it itself (sql_mode=%s, isolation %s)", k, SQLMode, Isolation)
		}
	}
	if cfg.Collation != "" && cfg.Collation != gomysql.NewConfig().Collation && !strings.HasPrefix(cfg.Collation, "utf8mb4") {
		return fmt.Errorf("mysql: parameter collation=%s: Ferry needs a utf8mb4 collation", cfg.Collation)
	}
	if !strings.HasPrefix(cfg.Collation, "utf8mb4") || cfg.Collation == gomysql.NewConfig().Collation {
		cfg.Collation = Collation
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Params["sql_mode"] = "'" + SQLMode + "'"
	return nil
}

// Open opens a pool on the MySQL or MariaDB database at url (see
// [ParseURL]) with Ferry's session settings, and checks that it answers.
func Open(url string) (*sql.DB, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if _, set := rawParams(url)["interpolateParams"]; !set {
		cfg.InterpolateParams = true
	}
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(&connector{Connector: c})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("mysql: connect to %s/%s as %q: %w", cfg.Addr, cfg.DBName, cfg.User, err)
	}
	return db, nil
}

// connector sets the isolation level on each new connection: the variable
// is transaction_isolation on MySQL 8 and tx_isolation on MariaDB before
// 11.1, so it cannot be a DSN parameter; SET SESSION TRANSACTION works on
// both.
type connector struct{ sqldriver.Connector }

func (c *connector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(sqldriver.ExecerContext)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("mysql: connection cannot execute statements")
	}
	if _, err := ex.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL "+Isolation, nil); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("mysql: set isolation level: %w", err)
	}
	return conn, nil
}

// New returns Ferry's driver over db, a database opened with [Open] (or
// with sql.Open("mysql", dsn) and equivalent settings: parseTime=true,
// loc=UTC, time_zone '+00:00', utf8mb4). db may be nil when only
// UnwrapExecutor is used.
func New(db *sql.DB) *databasesql.Driver {
	return databasesql.New(db, driver.MySQL, databasesql.WithErrorMapper(MapError))
}

// dupEntryRE reads MySQL's and MariaDB's 1062 message:
// "Duplicate entry 'x' for key 'name'" (MySQL 8: 'table.name').
var dupEntryRE = regexp.MustCompile(`(?s)^Duplicate entry '(.*)' for key '([^']*)'$`)

// MapError maps MySQL/MariaDB errors: 1062 to a *driver.UniqueViolationError
// (Constraint: the key name without the table; Detail: the message,
// "Duplicate entry '…' for key '…'"), 1213 to driver.ErrDeadlock, 1205 to
// driver.ErrLockTimeout. Other errors are returned unchanged.
func MapError(err error) error {
	var me *gomysql.MySQLError
	if err == nil || !errors.As(err, &me) {
		return err
	}
	switch me.Number {
	case ErDupEntry:
		uv := &driver.UniqueViolationError{Detail: me.Message, Err: err}
		if m := dupEntryRE.FindStringSubmatch(me.Message); m != nil {
			key := m[2]
			if i := strings.LastIndexByte(key, '.'); i >= 0 {
				key = key[i+1:]
			}
			uv.Constraint = key
		}
		return uv
	case ErLockDeadlock:
		return fmt.Errorf("%w: %w", driver.ErrDeadlock, err)
	case ErLockWaitTimeout:
		return fmt.Errorf("%w: %w", driver.ErrLockTimeout, err)
	}
	return err
}

// redactErr drops the password from an error that quotes the URL.
func redactErr(err error, raw string) error {
	msg := err.Error()
	if m := userinfoRE.FindStringSubmatch(raw); m != nil && m[1] != "" {
		msg = strings.ReplaceAll(msg, m[1], "xxxxx")
	}
	return errors.New(msg)
}

// userinfoRE finds the password of a URL (scheme://user:password@) or of a
// DSN (user:password@).
var userinfoRE = regexp.MustCompile(`^(?:[a-z]+://)?[^:/@]*:([^@]*)@`)

// rawParams returns the query parameters of a URL or DSN as given.
func rawParams(raw string) url.Values {
	i := strings.IndexByte(raw, '?')
	if i < 0 {
		return url.Values{}
	}
	v, err := url.ParseQuery(raw[i+1:])
	if err != nil {
		return url.Values{}
	}
	return v
}

// checkParams rejects parameters that contradict Ferry's settings and
// that go-sql-driver keeps in unexported fields.
func checkParams(p url.Values) error {
	for k, vs := range p {
		v := ""
		if len(vs) > 0 {
			v = vs[len(vs)-1]
		}
		switch strings.ToLower(k) {
		case "parsetime":
			if v != "true" && v != "1" {
				return fmt.Errorf("mysql: parameter parseTime=%s: Ferry needs parseTime=true", v)
			}
		case "charset":
			for _, c := range strings.Split(v, ",") {
				if !strings.HasPrefix(strings.ToLower(c), "utf8mb4") {
					return fmt.Errorf("mysql: parameter charset=%s: Ferry needs utf8mb4", v)
				}
			}
		}
	}
	return nil
}
