package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/sqlite"
)

// A SQLite unique violation maps to *driver.UniqueViolationError naming
// the table.column list, with a readable message (it used to read
// "unique constraint UNIQUE constraint failed: t.a (2067 violated: …").
func TestSQLiteUniqueViolationNamesTheColumns(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := sqlite.New(db).Executor()
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

// A connection that opens a fresh file while another connection holds a
// write lock on it cannot switch the file to WAL: SQLite answers SQLITE_BUSY
// at once, without waiting for the busy timeout. Open's connections
// retry their opening instead, so the open waits for the lock and succeeds
// when it is released (two `ferry migrate up` on a new file used to fail so).
func TestOpenWaitsForALockedFreshFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fresh.db")
	ctx := context.Background()
	// The holder waits for a lock as Ferry's connections do: its COMMIT
	// needs the opener's retries to let go of the read lock each takes
	// for a moment, and without a busy timeout it failed at once with
	// SQLITE_BUSY when one was in progress (2 of 100 runs under -race).
	holder, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	opened := make(chan error, 1)
	go func() { opened <- db.PingContext(ctx) }()
	select {
	case err := <-opened:
		t.Fatalf("opening while the fresh file is locked returned at once: %v; want it to wait for the lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("open after the lock was released: %v", err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal mode %q (%v), want wal", mode, err)
	}
}
