package driver_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestQueryRow(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	exec := sqlite.New(db).Executor()
	ctx := context.Background()
	if _, err := exec.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.Exec(ctx, `INSERT INTO kv VALUES ('a', 1), ('b', 2)`); err != nil {
		t.Fatal(err)
	}
	v := int64(-1)
	found, err := driver.QueryRow(ctx, exec, `SELECT v FROM kv WHERE k = $1`, []any{"zz"}, &v)
	if err != nil || found || v != -1 {
		t.Fatalf("no row: found %v, v %d, err %v; want not found, dest untouched", found, v, err)
	}
	found, err = driver.QueryRow(ctx, exec, `SELECT v FROM kv ORDER BY k`, nil, &v)
	if err != nil || !found || v != 1 {
		t.Fatalf("first of two rows: found %v, v %d, err %v", found, v, err)
	}
	var s string
	if _, err := driver.QueryRow(ctx, exec, `SELECT v, k FROM kv`, nil, &s); err == nil {
		t.Fatal("scanning two columns into one destination succeeded")
	}
	// A statement error is returned, not reported as "no row".
	found, err = driver.QueryRow(ctx, exec, `INSERT INTO kv VALUES ('a', 3) RETURNING v`, nil, &v)
	if err == nil {
		t.Fatalf("duplicate insert: found %v, err nil; want the statement's error", found)
	}
}
