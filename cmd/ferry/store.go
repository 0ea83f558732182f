package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/pgxv5"
)

// storeFlags are the flags every command that opens the database shares.
type storeFlags struct {
	url    string
	schema string
	prefix string
}

func (f *storeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "database-url", "", "database URL: postgres://… or sqlite:PATH (env FERRY_DATABASE_URL)")
	cmd.Flags().StringVar(&f.schema, "schema", "", "Postgres schema of Ferry's tables (default: search_path)")
	cmd.Flags().StringVar(&f.prefix, "table-prefix", ferry.DefaultTablePrefix, "prefix of Ferry's table names")
}

func (f *storeFlags) tables() ferry.Tables { return ferry.Tables{Schema: f.schema, Prefix: f.prefix} }

// store is an open database with both the generic executor and, for
// Postgres, the pgx pool (LISTEN/NOTIFY, replication need it).
type store struct {
	dialect driver.Dialect
	pgx     *pgxv5.Driver       // Postgres only
	sql     *databasesql.Driver // SQLite only
	pool    *pgxpool.Pool
	db      *sql.DB
	tables  ferry.Tables
}

func (s *store) Dialect() driver.Dialect { return s.dialect }

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

// open connects to the database named by the flag or FERRY_DATABASE_URL.
func (f *storeFlags) open(ctx context.Context, cmd *cobra.Command) (*store, error) {
	applyEnv(cmd)
	if err := f.tables().Check(); err != nil {
		return nil, err
	}
	return openStore(ctx, f.url, f.tables())
}

func openStore(ctx context.Context, url string, tables ferry.Tables) (*store, error) {
	switch {
	case url == "":
		return nil, fmt.Errorf("no database: set --database-url or FERRY_DATABASE_URL")
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		return &store{dialect: driver.Postgres, pgx: pgxv5.New(pool), pool: pool, tables: tables}, nil
	default:
		path := strings.TrimPrefix(strings.TrimPrefix(url, "sqlite://"), "sqlite:")
		db, err := databasesql.OpenSQLite(path)
		if err != nil {
			return nil, err
		}
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open sqlite %s: %w", path, err)
		}
		return &store{dialect: driver.SQLite, sql: databasesql.New(db, driver.SQLite), db: db, tables: tables}, nil
	}
}

// applyEnv sets every flag not given on the command line from FERRY_<FLAG>
// (dashes become underscores), so containers can configure by environment.
func applyEnv(cmd *cobra.Command) {
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if fl.Changed {
			return
		}
		env := "FERRY_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			_ = fl.Value.Set(v)
		}
	})
}
