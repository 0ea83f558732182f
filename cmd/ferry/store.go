package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/logattr"
)

// storeFlags are the flags every command that opens the database shares.
type storeFlags struct {
	url    string
	schema string
	prefix string
	// minConns, when set, is the smallest Postgres pool the command needs
	// (ferry relay: its workers, lease loop, LISTEN and cleanup); it
	// raises pgxpool's default (max(4, CPUs)) unless the URL sets
	// pool_max_conns itself.
	minConns int
}

func (f *storeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "database-url", "", "database URL: postgres://…, mysql://… or sqlite:PATH (env FERRY_DATABASE_URL)")
	cmd.Flags().StringVar(&f.schema, "schema", "", "Postgres schema (MySQL: database) of Ferry's tables (default: search_path / the URL's database)")
	cmd.Flags().StringVar(&f.prefix, "table-prefix", ferry.DefaultTablePrefix, "prefix of Ferry's table names")
}

func (f *storeFlags) tables() ferry.Tables { return ferry.Tables{Schema: f.schema, Prefix: f.prefix} }

// store is an open database with both the generic executor and, for
// Postgres, the pgx pool (LISTEN/NOTIFY, replication need it).
type store struct {
	dialect driver.Dialect
	pgx     *pgxv5.Driver       // Postgres only
	sql     *databasesql.Driver // SQLite and MySQL
	pool    *pgxpool.Pool
	db      *sql.DB
	tables  ferry.Tables
}

func (s *store) Dialect() driver.Dialect { return s.dialect }

// MaxConns is the pool's cap (driver.PoolSizer), so the relay can check it
// against its workers.
func (s *store) MaxConns() int {
	if s.pgx != nil {
		return s.pgx.MaxConns()
	}
	return s.sql.MaxConns()
}

// Pool is the Postgres pool (nil otherwise): the relay counts a LISTEN
// connection taken from it.
func (s *store) Pool() *pgxpool.Pool { return s.pool }

// Executor runs on the pool.
func (s *store) Executor() driver.Executor {
	if s.pgx != nil {
		return s.pgx.Executor()
	}
	return s.sql.Executor()
}

// Begin starts a transaction.
func (s *store) Begin(ctx context.Context) (driver.Tx, error) {
	if s.pgx != nil {
		return s.pgx.Begin(ctx)
	}
	return s.sql.Begin(ctx)
}

func (s *store) Close() {
	if s.pool != nil {
		s.pool.Close()
	}
	if s.db != nil {
		_ = s.db.Close()
	}
}

// open connects to the database named by the flag or FERRY_DATABASE_URL
// and checks that Ferry's tables are installed: a command never creates a
// database file, and a database without the tables says so and names the
// command that installs them.
func (f *storeFlags) open(ctx context.Context, cmd *cobra.Command) (*store, error) {
	s, err := f.openWith(ctx, cmd, false)
	if err != nil {
		return nil, err
	}
	if err := s.requireTables(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openForMigrate is open for the migrate commands: create (migrate up)
// may create a SQLite file; no table check.
func (f *storeFlags) openForMigrate(ctx context.Context, cmd *cobra.Command, create bool) (*store, error) {
	return f.openWith(ctx, cmd, create)
}

func (f *storeFlags) openWith(ctx context.Context, cmd *cobra.Command, create bool) (*store, error) {
	if err := applyEnv(cmd); err != nil {
		return nil, err
	}
	if err := f.tables().Check(); err != nil {
		return nil, err
	}
	return openDatabase(ctx, f.url, f.tables(), create, f.minConns)
}

// openStore opens url without creating anything (see openDatabase).
func openStore(ctx context.Context, url string, tables ferry.Tables) (*store, error) {
	return openDatabase(ctx, url, tables, false, 0)
}

// errUnsupportedDatabase is returned for a --database-url Ferry cannot open.
var errUnsupportedDatabase = errors.New("unsupported --database-url")

// acceptedDatabaseURLs is the one description of what --database-url takes.
const acceptedDatabaseURLs = "postgres://…, postgresql://…, mysql://user:pass@host:port/db, sqlite:PATH, sqlite://PATH, or a file path ending in .db, .sqlite or .sqlite3"

// parseDatabaseURL tells Postgres from SQLite. A bare word is never taken
// for a SQLite file: a typo must not create an empty database.
func parseDatabaseURL(raw string) (driver.Dialect, string, error) {
	switch {
	case raw == "":
		return "", "", fmt.Errorf("no database: set --database-url or FERRY_DATABASE_URL (%s)", acceptedDatabaseURLs)
	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		return driver.Postgres, raw, nil
	case strings.HasPrefix(raw, "mysql://"), strings.HasPrefix(raw, "mariadb://"):
		return driver.MySQL, raw, nil
	case strings.HasPrefix(raw, "sqlite://"):
		return sqlitePath(raw, strings.TrimPrefix(raw, "sqlite://"))
	case strings.HasPrefix(raw, "sqlite:"):
		return sqlitePath(raw, strings.TrimPrefix(raw, "sqlite:"))
	}
	if i := strings.Index(raw, "://"); i > 0 {
		return "", "", fmt.Errorf("%w: scheme %q in %q is not supported; use %s", errUnsupportedDatabase, raw[:i], redactURL(raw), acceptedDatabaseURLs)
	}
	for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(raw, ext) {
			return sqlitePath(raw, raw)
		}
	}
	return "", "", fmt.Errorf("%w: %q is neither a URL nor a SQLite file name; use %s", errUnsupportedDatabase, redactURL(raw), acceptedDatabaseURLs)
}

func sqlitePath(raw, path string) (driver.Dialect, string, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return "", "", fmt.Errorf("%w: %q: want sqlite:PATH with a plain file path", errUnsupportedDatabase, raw)
	}
	return driver.SQLite, path, nil
}

// redactURL hides a password in a URL shown in an error or a log line
// (internal/logattr's one rule).
func redactURL(raw string) string { return logattr.RedactURL(raw) }

// openDatabase connects. A SQLite file is created only when create is set
// (ferry migrate up); every other command refuses a missing file. A
// Postgres pool gets at least minConns connections unless the URL sets
// pool_max_conns.
func openDatabase(ctx context.Context, url string, tables ferry.Tables, create bool, minConns int) (*store, error) {
	dialect, target, err := parseDatabaseURL(url)
	if err != nil {
		return nil, err
	}
	switch dialect {
	case driver.Postgres:
		cfg, err := pgxpool.ParseConfig(target)
		if err != nil {
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		if int(cfg.MaxConns) < minConns && !strings.Contains(target, "pool_max_conns") {
			cfg.MaxConns = int32(minConns)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		return &store{dialect: driver.Postgres, pgx: pgxv5.New(pool), pool: pool, tables: tables}, nil
	case driver.MySQL:
		db, err := mysql.Open(target)
		if err != nil {
			return nil, err
		}
		return &store{dialect: driver.MySQL, sql: mysql.New(db), db: db, tables: tables}, nil
	default:
		if !create {
			if _, err := os.Stat(target); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil, fmt.Errorf("sqlite database %s does not exist (create it and Ferry's tables with: ferry migrate up --database-url sqlite:%s)", target, target)
				}
				return nil, fmt.Errorf("sqlite database %s: %w", target, err)
			}
		}
		db, err := sqlite.Open(target)
		if err != nil {
			return nil, err
		}
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open sqlite %s: %w", target, err)
		}
		return &store{dialect: driver.SQLite, sql: sqlite.New(db), db: db, tables: tables}, nil
	}
}

// errNotInstalled says a database has no Ferry tables.
var errNotInstalled = errors.New("Ferry's tables are not installed")

// requireTables checks the outbox table exists where the flags say, so a
// fresh database gets an instruction instead of a raw "relation does not
// exist" from whichever query runs first. Which other tables are missing
// is ferry status's business (it reports each section).
func (s *store) requireTables(ctx context.Context) error {
	var n int
	var err error
	if s.dialect == driver.Postgres {
		err = s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
WHERE c.relname = $1 AND (($2 = '' AND ns.nspname = ANY (current_schemas(false))) OR ns.nspname = $2)`,
			s.tables.Bare("outbox"), s.tables.Schema).Scan(&n)
	} else if s.dialect == driver.MySQL {
		err = s.db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = ? AND table_schema = COALESCE(NULLIF(?, ''), DATABASE())`,
			s.tables.Bare("outbox"), s.tables.Schema).Scan(&n)
	} else {
		err = s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, s.tables.Bare("outbox")).Scan(&n)
	}
	if err != nil {
		return fmt.Errorf("check Ferry's tables: %w", err)
	}
	if n == 0 {
		where := "the search_path"
		if s.dialect == driver.MySQL {
			where = "the URL's database"
		}
		if s.tables.Schema != "" {
			where = "schema " + s.tables.Schema
		}
		return fmt.Errorf("%w: no table %s in %s (install them with: ferry migrate up, with the same --database-url, --schema and --table-prefix)", errNotInstalled, s.tables.Bare("outbox"), where)
	}
	return nil
}

// applyEnv sets every flag not given on the command line from FERRY_<FLAG>
// (dashes become underscores), so containers can configure by environment.
// A value the flag refuses is an error naming the variable, never ignored.
func applyEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if fl.Changed {
			return
		}
		env := envName(fl.Name)
		if v, ok := os.LookupEnv(env); ok {
			if err := fl.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q (for --%s): %w", env, v, fl.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// envName is the environment variable of a flag.
func envName(flag string) string {
	return "FERRY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
