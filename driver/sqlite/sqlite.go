// Package sqlite is Ferry's SQLite driver: [Open] opens a file with the
// settings Ferry relies on (modernc.org/sqlite, pure Go) and [New] builds
// the database/sql driver over it. It is its own package so that services
// on Postgres or MySQL do not link SQLite, as river keeps its SQLite driver
// apart.
package sqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"time"

	msqlite "modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
)

// BusyTimeout is how long a SQLite connection opened by [Open]
// waits for a lock held by another connection or process before it fails
// with SQLITE_BUSY: SQLite's busy timeout, and the bound on retrying a
// connection's opening. SQLite's busy handler polls and is not fair: with
// many concurrent writers on a slow machine one of them can lose every
// retry for the whole timeout (seen once in CI: 16 goroutines writing
// transactions of 20-40 ms each under the race detector). Keep SQLite's
// writers few (or the pool small: db.SetMaxOpenConns); a deployment with
// many concurrent writers belongs on Postgres or MySQL.
const BusyTimeout = 60 * time.Second

// Open opens (creating if needed) the SQLite file at path with the
// settings Ferry relies on: WAL, a busy timeout, immediate transactions
// (writers serialise at BEGIN, which is what makes per-aggregate sequencing
// safe) and a sortable time format.
//
// Opening a connection to a fresh file switches it to WAL, a write that
// SQLite refuses with SQLITE_BUSY at once, without waiting for the busy
// timeout, when another connection switches it at the same moment (two
// `ferry migrate up` processes on a new file). Such openings are retried
// until BusyTimeout; by then the other connection has made the file
// WAL and the retry finds nothing to switch.
func Open(path string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	q.Set("_time_format", "sqlite")
	c, err := msqlite.NewConnector("file:" + path + "?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return sql.OpenDB(&busyRetryConnector{Connector: c, wait: BusyTimeout}), nil
}

// busyRetryConnector retries opening a connection that failed with
// SQLITE_BUSY, backing off, until wait has passed or ctx is done.
type busyRetryConnector struct {
	sqldriver.Connector
	wait time.Duration
}

func (c *busyRetryConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	deadline := time.Now().Add(c.wait)
	delay := time.Millisecond
	for {
		conn, err := c.Connector.Connect(ctx)
		var sqErr *msqlite.Error
		if err == nil || !errors.As(err, &sqErr) || sqErr.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().Add(delay).After(deadline) {
			return conn, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// New returns Ferry's driver over db, a database opened with [Open] (or
// sql.Open("sqlite", …) with equivalent settings). db may be nil when only
// UnwrapExecutor is used.
func New(db *sql.DB) *databasesql.Driver { return databasesql.New(db, driver.SQLite) }
