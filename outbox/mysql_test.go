package outbox_test

import (
	"database/sql"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/storetest"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestConformanceMySQL(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		d := testenv.NewMySQLDatabase(t)
		return storetest.Harness[*sql.Tx]{Driver: mysql.New(d.DB)}
	})
}

func TestConformanceMySQLExplicitDatabaseAndPrefix(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		d := testenv.NewMySQLDatabase(t)
		return storetest.Harness[*sql.Tx]{Driver: mysql.New(d.DB), Tables: ferry.Tables{Schema: d.Name, Prefix: "app_"}}
	})
}
