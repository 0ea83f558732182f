package migrate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// MySQLLockWait bounds how long Up on MySQL waits for another Up holding
// the migration lock.
const MySQLLockWait = 5 * time.Minute

// upMySQL applies pending migrations on MySQL/MariaDB.
//
// Concurrent Up calls, in one process or many, are serialised by a named
// lock (GET_LOCK, keyed by the database and the table prefix) held by the
// session of the transaction that runs the migrations; the server releases
// it when that session ends, so a killed process does not leave it held.
//
// MySQL commits every DDL statement on its own (the transaction Up opens
// only pins one connection). A migration's statements run in order and its
// version is recorded after the last one, so a crash in between leaves a
// migration half applied and unrecorded. The next Up runs that migration
// again from its first statement and treats "already exists" answers —
// table (1050), column (1060), index or key name (1061) — as done; the
// only data a migration writes (0005's settings) is an upsert. Re-running a
// half-applied migration therefore completes it.
func upMySQL(ctx context.Context, db DB, tables ferry.Tables, ms []Migration) ([]Migration, error) {
	var ran []Migration
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The lock's name: at most 64 characters on both servers.
	key := "ferry.migrate." + tables.Schema + "." + tables.Bare("")
	var got *int64
	found, err := driver.QueryRow(ctx, tx,
		`SELECT GET_LOCK(CONCAT('ferry.migrate.', LEFT(SHA1(CONCAT(DATABASE(), '/', $1)), 40)), $2)`,
		[]any{key, int(MySQLLockWait.Seconds())}, &got)
	switch {
	case err != nil:
		return nil, fmt.Errorf("migrate: lock: %w", err)
	case !found || got == nil:
		return nil, errors.New("migrate: lock: GET_LOCK returned no result")
	case *got != 1:
		return nil, fmt.Errorf("migrate: lock: another `ferry migrate up` held the migration lock for %s", MySQLLockWait)
	}
	released := false
	release := func() error {
		released = true
		// The session goes back to the pool: release the lock explicitly
		// (a session that ends releases it too).
		_, err := tx.Exec(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(CONCAT('ferry.migrate.', LEFT(SHA1(CONCAT(DATABASE(), '/', $1)), 40)))`, key)
		return err
	}
	defer func() {
		if !released {
			_ = release()
		}
	}()
	if err := prepare(ctx, tx, tables); err != nil {
		return nil, err
	}
	applied, err := appliedVersions(ctx, tx, tables)
	if err != nil {
		return nil, err
	}
	done := map[int]bool{}
	for _, a := range applied {
		done[a.Version] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := tx.Exec(ctx, stmt); err != nil && !alreadyApplied(err) {
				return ran, fmt.Errorf("migrate: apply %04d_%s: %w\n-- statement:\n%s", m.Version, m.Name, err, stmt)
			}
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (version, name, applied_at) VALUES ($1, $2, $3)`, tables.Name("migrations")),
			m.Version, m.Name, time.Now().UTC()); err != nil {
			return ran, fmt.Errorf("migrate: record %04d_%s: %w", m.Version, m.Name, err)
		}
		ran = append(ran, m)
	}
	if err := release(); err != nil {
		return ran, fmt.Errorf("migrate: release lock: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return ran, fmt.Errorf("migrate: commit: %w", err)
	}
	return ran, nil
}

// mysqlExistsRE matches go-sql-driver's "Error 1050 (42S01): …" for the
// errors a re-run DDL statement gets: table exists (1050), duplicate column
// (1060), duplicate key name (1061). Read from the message so the core does
// not link the MySQL client.
var mysqlExistsRE = regexp.MustCompile(`\bError (1050|1060|1061) \(`)

func alreadyApplied(err error) bool { return mysqlExistsRE.MatchString(err.Error()) }
