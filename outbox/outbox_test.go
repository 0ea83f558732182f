package outbox_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/storetest"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestConformancePgx(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[pgx.Tx] {
		s := testenv.NewPostgresSchema(t)
		return storetest.Harness[pgx.Tx]{Driver: pgxv5.New(s.Pool)}
	})
}

func TestConformancePgxExplicitSchema(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[pgx.Tx] {
		s := testenv.NewPostgresSchema(t)
		return storetest.Harness[pgx.Tx]{Driver: pgxv5.New(s.Pool), Tables: ferry.Tables{Schema: s.Schema, Prefix: "app_"}}
	})
}

func TestConformanceDatabaseSQLPostgres(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		s := testenv.NewPostgresSchema(t)
		return storetest.Harness[*sql.Tx]{Driver: databasesql.New(s.OpenSQL(t), driver.Postgres)}
	})
}

func TestConformanceSQLite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		db, _ := testenv.NewSQLite(t)
		return storetest.Harness[*sql.Tx]{Driver: sqlite.New(db)}
	})
}
