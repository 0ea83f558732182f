// Package migrate creates and upgrades Ferry's tables. Migrations are
// versioned SQL files embedded in the module, one set per dialect, rendered
// with the configured [ferry.Tables] names. They run from Go ([Up]) or from
// the CLI (`ferry migrate up|status|sql`); [SQL] prints the DDL for users who
// keep their schema in goose, atlas or golang-migrate.
package migrate

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/partition"
)

//go:embed migrations
var migrationsFS embed.FS

// Migration is one versioned step.
type Migration struct {
	Version int
	Name    string
	// SQL is the rendered DDL for the dialect and table names it was loaded for.
	SQL string
}

// DB is what migrations need from a driver: both Ferry drivers satisfy it.
type DB interface {
	Dialect() driver.Dialect
	Begin(ctx context.Context) (driver.Tx, error)
}

// Applied is a migration recorded as done in the database.
type Applied struct {
	Version   int
	Name      string
	AppliedAt time.Time
}

// Status is the state of a database's schema.
type Status struct {
	Current int       // highest applied version, 0 when none
	Latest  int       // highest version shipped in this build
	Applied []Applied // in version order
	Pending []Migration
}

// Option changes how migrations are rendered or applied.
type Option func(*options)

type options struct {
	partitionInterval time.Duration // 0: a plain outbox table
	inboxInterval     time.Duration // 0: a plain inbox table
}

// WithPartitionedOutbox creates the outbox as a table partitioned by
// created_at in ranges of interval (Postgres only; e.g. 24h), so cleanup
// drops whole partitions instead of deleting rows (docs/PARTITIONING.md).
// It takes effect when the outbox is created, i.e. with migration 0001:
// given to Up for a database whose outbox is already a plain table, Up
// refuses with a *ferry.ConfigError. Up also creates the first partitions
// (partition.DefaultAhead beyond the current one); the relay and cleanup
// keep creating them ahead.
func WithPartitionedOutbox(interval time.Duration) Option {
	return func(o *options) { o.partitionInterval = interval }
}

// WithPartitionedInbox creates the inbox partitioned by event_id in
// ranges of interval (Postgres only; e.g. 24h): Ferry's event ids are
// UUIDv7s, whose first 48 bits are the time, so each range holds the
// claims of the events made in one interval, and the primary key
// (consumer, tenant_id, event_id) — the dedup of G4 — stays unique over
// the whole table. A DEFAULT partition takes ids that are not UUIDv7s or
// fall outside the ranges made; it is never dropped. Cleanup drops a
// range once every claim in it was applied before the inbox retention
// (docs/PARTITIONING.md). Like WithPartitionedOutbox it takes effect when
// the inbox is created (migration 0003) and is refused, with a
// *ferry.ConfigError, on an inbox that exists as a plain table or is
// partitioned by another interval. Up creates the first partitions; the
// inbox consumer and cleanup keep creating them ahead.
func WithPartitionedInbox(interval time.Duration) Option {
	return func(o *options) { o.inboxInterval = interval }
}

func buildOptions(dialect driver.Dialect, opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.partitionInterval != 0 {
		if dialect != driver.Postgres {
			return o, &ferry.ConfigError{Field: "partitioned_outbox", Reason: fmt.Sprintf("a partitioned outbox is supported on Postgres only, not %s", dialect)}
		}
		if err := partition.CheckInterval("partitioned_outbox", o.partitionInterval); err != nil {
			return o, err
		}
	}
	if o.inboxInterval != 0 {
		if dialect != driver.Postgres {
			return o, &ferry.ConfigError{Field: "partitioned_inbox", Reason: fmt.Sprintf("a partitioned inbox is supported on Postgres only, not %s", dialect)}
		}
		if err := partition.CheckInterval("partitioned_inbox", o.inboxInterval); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Load returns every migration shipped for dialect, rendered for tables,
// in version order.
func Load(dialect driver.Dialect, tables ferry.Tables, opts ...Option) ([]Migration, error) {
	if err := tables.Check(); err != nil {
		return nil, err
	}
	o, err := buildOptions(dialect, opts)
	if err != nil {
		return nil, err
	}
	if dialect == driver.SQLite && tables.Schema != "" {
		return nil, &ferry.ConfigError{Field: "tables.schema", Reason: "must be empty on SQLite"}
	}
	dir := path.Join("migrations", string(dialect))
	entries, err := fs.ReadDir(migrationsFS, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: no migrations for dialect %q: %w", dialect, err)
	}
	funcs := template.FuncMap{}
	data := names{t: tables, mysql: dialect == driver.MySQL, Partitioned: o.partitionInterval != 0, PartitionedInbox: o.inboxInterval != 0}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrate: bad migration file name %q (want NNNN_name.sql)", e.Name())
		}
		raw, err := migrationsFS.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(e.Name()).Funcs(funcs).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migrate: parse %s: %w", e.Name(), err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("migrate: render %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: buf.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrate: two migrations with version %d", out[i].Version)
		}
	}
	return out, nil
}

// names is the template data: {{.T "outbox"}} is a qualified table name,
// {{.I "outbox_pending_idx"}} an index or constraint name. MySQL's are
// quoted with backticks, so the DDL `ferry migrate sql` prints runs without
// ANSI_QUOTES (the names are validated identifiers: no quote inside).
type names struct {
	t     ferry.Tables
	mysql bool
	// Partitioned: {{if .Partitioned}} renders the partitioned outbox.
	Partitioned bool
	// PartitionedInbox: {{if .PartitionedInbox}} renders the partitioned
	// inbox and its default partition.
	PartitionedInbox bool
}

func (n names) T(base string) string    { return n.quote(n.t.Name(base)) }
func (n names) I(base string) string    { return n.quote(n.t.Ident(base)) }
func (n names) Bare(base string) string { return n.t.Bare(base) }

func (n names) quote(s string) string {
	if n.mysql {
		return strings.ReplaceAll(s, `"`, "`")
	}
	return s
}

// SQL returns the DDL of every migration for dialect, for pasting into
// another migration tool. It does not include Ferry's own version table.
//
// With WithPartitionedOutbox the DDL creates no partition: create them
// with `ferry migrate up` (or let the relay do it) before the first write.
// With WithPartitionedInbox it creates only the inbox's default partition
// (claims work at once); `ferry migrate up`, the inbox consumer or
// cleanup create the ranges.
func SQL(dialect driver.Dialect, tables ferry.Tables, opts ...Option) (string, error) {
	ms, err := Load(dialect, tables, opts...)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if tables.Schema != "" {
		if dialect == driver.MySQL {
			fmt.Fprintf(&b, "CREATE DATABASE IF NOT EXISTS `%s` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;\n\n", tables.Schema)
		} else {
			fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %q;\n\n", tables.Schema)
		}
	}
	for _, m := range ms {
		fmt.Fprintf(&b, "-- ferry migration %04d_%s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.SQL))
		b.WriteString("\n")
	}
	return b.String(), nil
}

// Up applies every pending migration in one transaction, so a failure
// leaves the schema as it was. Concurrent Up calls, in one process or many,
// are serialised: by an advisory lock on Postgres, by the database's write
// lock on SQLite, taken at BEGIN IMMEDIATE and waited for up to the busy
// timeout when the database is opened with sqlite.Open (which
// also retries a connection that finds a fresh file being switched to WAL
// by another). It returns the migrations it applied; none when the schema
// is current.
//
// MySQL and MariaDB have no transactional DDL: each statement commits on
// its own, so there Up applies a migration statement by statement and
// records its version when all of them ran; see [upMySQL] for how a crash
// in between is recovered.
func Up(ctx context.Context, db DB, tables ferry.Tables, opts ...Option) ([]Migration, error) {
	ms, err := Load(db.Dialect(), tables, opts...)
	if err != nil {
		return nil, err
	}
	o, _ := buildOptions(db.Dialect(), opts) // checked by Load
	if db.Dialect() == driver.MySQL {
		return upMySQL(ctx, db, tables, ms)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
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
	var ran []Migration
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if err := execScript(ctx, tx, m.SQL); err != nil {
			return nil, fmt.Errorf("migrate: apply %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (version, name, applied_at) VALUES ($1, $2, $3)`, tables.Name("migrations")),
			m.Version, m.Name, time.Now().UTC()); err != nil {
			return nil, fmt.Errorf("migrate: record %04d_%s: %w", m.Version, m.Name, err)
		}
		ran = append(ran, m)
	}
	if err := ensurePartitions(ctx, tx, tables, o); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return ran, nil
}

// ensurePartitions checks that the outbox and the inbox are partitioned
// when asked and creates the partitions they need from now on. A
// partitioned table gets its partitions created ahead by every Up, asked
// or not.
func ensurePartitions(ctx context.Context, tx driver.Tx, tables ferry.Tables, o options) error {
	if tx.Dialect() != driver.Postgres {
		return nil
	}
	for _, c := range []struct {
		tb       partition.Table
		field    string
		interval time.Duration
	}{{partition.Outbox, "partitioned_outbox", o.partitionInterval}, {partition.Inbox, "partitioned_inbox", o.inboxInterval}} {
		if err := ensureTable(ctx, tx, tables, c.tb, c.field, c.interval); err != nil {
			return err
		}
	}
	return nil
}

// ensureTable is ensurePartitions for one table; field names the option
// in refusals. An inbox range whose rows already sit in the default
// partition is skipped, not an error (partition.ErrDefaultHoldsRange):
// its claims stay deduplicated there, and the migration must not fail
// for it.
func ensureTable(ctx context.Context, tx driver.Tx, tables ferry.Tables, tb partition.Table, field string, interval time.Duration) error {
	parted, err := partition.IsPartitioned(ctx, tx, tables, tb)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if !parted {
		if interval != 0 {
			return &ferry.ConfigError{Field: field,
				Reason: fmt.Sprintf("the %s already exists as a plain table; a partitioned %s is chosen when the %s is first created (see docs/PARTITIONING.md)", tb, tb, tb)}
		}
		return nil
	}
	parts, err := partition.List(ctx, tx, tables, tb)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if w, ok := partition.Interval(parts); ok && interval != 0 && w != interval {
		return &ferry.ConfigError{Field: field,
			Reason: fmt.Sprintf("the %s is partitioned by %s, not %s; the interval is fixed when the %s is created", tb, w, interval, tb)}
	}
	if _, err := partition.Ensure(ctx, tx, tables, tb, time.Now(), interval, partition.DefaultAhead); err != nil && !errors.Is(err, partition.ErrDefaultHoldsRange) {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// CurrentStatus reports which migrations are applied and which are pending.
func CurrentStatus(ctx context.Context, db DB, tables ferry.Tables) (Status, error) {
	ms, err := Load(db.Dialect(), tables)
	if err != nil {
		return Status{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := prepare(ctx, tx, tables); err != nil {
		return Status{}, err
	}
	applied, err := appliedVersions(ctx, tx, tables)
	if err != nil {
		return Status{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Status{}, err
	}
	st := Status{Applied: applied}
	done := map[int]bool{}
	for _, a := range applied {
		done[a.Version] = true
		st.Current = max(st.Current, a.Version)
	}
	for _, m := range ms {
		st.Latest = max(st.Latest, m.Version)
		if !done[m.Version] {
			st.Pending = append(st.Pending, m)
		}
	}
	return st, nil
}

func prepare(ctx context.Context, tx driver.Tx, tables ferry.Tables) error {
	if tx.Dialect() == driver.Postgres {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ferry.migrate'))`); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if tables.Schema != "" {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %q`, tables.Schema)); err != nil {
				return fmt.Errorf("migrate: create schema %s: %w", tables.Schema, err)
			}
		}
	}
	ts, tail, text := "timestamptz", "", "text"
	switch tx.Dialect() {
	case driver.SQLite:
		ts = "TIMESTAMP"
	case driver.MySQL:
		ts, tail, text = "DATETIME(6)", " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin", "VARCHAR(255)"
		if tables.Schema != "" {
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE DATABASE IF NOT EXISTS `%s` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", tables.Schema)); err != nil {
				return fmt.Errorf("migrate: create database %s: %w", tables.Schema, err)
			}
		}
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		version    integer PRIMARY KEY,
		name       %s NOT NULL,
		applied_at %s NOT NULL)%s`, tables.Name("migrations"), text, ts, tail))
	if err != nil {
		return fmt.Errorf("migrate: create version table: %w", err)
	}
	return nil
}

func appliedVersions(ctx context.Context, tx driver.Tx, tables ferry.Tables) ([]Applied, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT version, name, applied_at FROM %s ORDER BY version`, tables.Name("migrations")))
	if err != nil {
		return nil, fmt.Errorf("migrate: read versions: %w", err)
	}
	defer rows.Close()
	var out []Applied
	for rows.Next() {
		var a Applied
		if err := rows.Scan(&a.Version, &a.Name, &a.AppliedAt); err != nil {
			return nil, fmt.Errorf("migrate: read versions: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// execScript runs a multi-statement script. Postgres takes it whole (simple
// protocol); SQLite's driver runs one statement per call, so split on ";" at
// line ends (our migrations never put ";" at a line end inside a statement).
func execScript(ctx context.Context, tx driver.Tx, script string) error {
	if tx.Dialect() == driver.Postgres {
		_, err := tx.Exec(ctx, script)
		return err
	}
	for _, stmt := range splitStatements(script) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%w\n-- statement:\n%s", err, stmt)
		}
	}
	return nil
}

func splitStatements(script string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			if s := strings.TrimSpace(cur.String()); s != "" {
				out = append(out, s)
			}
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
