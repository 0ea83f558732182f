package databasesql_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
)

// A SQLite unique violation maps to *driver.UniqueViolationError naming
// the table.column list, with a readable message (it used to read
// "unique constraint UNIQUE constraint failed: t.a (2067 violated: …").
func TestSQLiteUniqueViolationNamesTheColumns(t *testing.T) {
	db, err := databasesql.OpenSQLite(filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := databasesql.New(db, driver.SQLite).Executor()
	ctx := context.Background()
	for _, q := range []string{`CREATE TABLE t (a text UNIQUE, b text, c text, UNIQUE (b, c))`, `INSERT INTO t VALUES ('x', 'y', 'z')`} {
		if _, err := exec.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ insert, constraint string }{
		{`INSERT INTO t VALUES ('x', '1', '2')`, "t.a"},
		{`INSERT INTO t VALUES ('w', 'y', 'z')`, "t.b, t.c"},
	} {
		_, err := exec.Exec(ctx, c.insert)
		var uv *driver.UniqueViolationError
		if !errors.Is(err, driver.ErrUniqueViolation) || !errors.As(err, &uv) {
			t.Fatalf("%s: err = %v, want a UniqueViolationError", c.insert, err)
		}
		if uv.Constraint != c.constraint {
			t.Fatalf("%s: constraint %q, want %q", c.insert, uv.Constraint, c.constraint)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "driver: unique constraint "+c.constraint+" violated: ") || strings.Count(msg, "(2067") > 1 ||
			strings.Contains(msg, "(2067 violated") {
			t.Fatalf("%s: message %q", c.insert, msg)
		}
	}
}
