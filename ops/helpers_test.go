package ops_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// env is one migrated database with an outbox writer and Ops over it.
type env struct {
	name    string
	db      ops.DB
	exec    driver.Executor
	ops     *ops.Ops
	insert  func(t testing.TB, evs ...ferry.Event) []ferry.Event
	dialect driver.Dialect
	pg      *testenv.PostgresSchema // Postgres only
	sqlDB   *sql.DB                 // SQLite and MySQL
}

var tables = ferry.Tables{}

func newPostgres(t *testing.T, opts ...ops.Option) *env {
	t.Helper()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	e := setup(t, "postgres", drv, opts...)
	e.pg = s
	return e
}

// newPostgresB is newPostgres for benchmarks.
func newPostgresB(b *testing.B, opts ...ops.Option) *env {
	b.Helper()
	s := testenv.NewPostgresSchema(b)
	e := setupTB(b, "postgres", pgxv5.New(s.Pool), opts...)
	e.pg = s
	return e
}

func newSQLite(t *testing.T, opts ...ops.Option) *env {
	t.Helper()
	db, _ := testenv.NewSQLite(t)
	e := setup(t, "sqlite", sqlite.New(db), opts...)
	e.sqlDB = db
	return e
}

func newMySQL(t *testing.T, opts ...ops.Option) *env {
	t.Helper()
	d := testenv.NewMySQLDatabase(t)
	e := setup(t, "mysql", mysql.New(d.DB), opts...)
	e.sqlDB = d.DB
	return e
}

func setup[TTx any](t *testing.T, name string, drv driver.Driver[TTx], opts ...ops.Option) *env {
	t.Helper()
	return setupTB(t, name, drv, opts...)
}

func setupTB[TTx any](t testing.TB, name string, drv driver.Driver[TTx], opts ...ops.Option) *env {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, tables); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	w, err := outbox.New(drv, outbox.WithTables(tables), outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	db, ok := any(drv).(ops.DB)
	if !ok {
		t.Fatalf("%T is not an ops.DB", drv)
	}
	o, err := ops.New(db, append([]ops.Option{ops.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &env{
		name: name, db: db, exec: drv.Executor(), ops: o, dialect: drv.Dialect(),
		insert: func(t testing.TB, evs ...ferry.Event) []ferry.Event {
			t.Helper()
			out, err := w.Insert(ctx, evs...)
			if err != nil {
				t.Fatalf("outbox insert: %v", err)
			}
			return out
		},
	}
}

// both runs fn against Postgres, SQLite and MySQL/MariaDB.
func both(t *testing.T, fn func(t *testing.T, e *env), opts ...ops.Option) {
	t.Run("postgres", func(t *testing.T) { fn(t, newPostgres(t, opts...)) })
	t.Run("sqlite", func(t *testing.T) { fn(t, newSQLite(t, opts...)) })
	t.Run("mysql", func(t *testing.T) { fn(t, newMySQL(t, opts...)) })
}

// seqCTE is a WITH clause defining n(i) = 1..count (count <= 1,000,000)
// on every dialect, recursing at most 100 times: MariaDB's
// max_recursive_iterations and MySQL's cte_max_recursion_depth stop a
// recursive CTE at 1,000 by default.
func seqCTE(count int) string {
	return fmt.Sprintf(`WITH RECURSIVE d(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM d WHERE j < 99),
n(i) AS (SELECT a.j * 10000 + b.j * 100 + c.j + 1 FROM d a CROSS JOIN d b CROSS JOIN d c WHERE a.j * 10000 + b.j * 100 + c.j < %d)`, count)
}

// cat is the SQL concatenation of the expressions in e's dialect.
func cat(e *env, exprs ...string) string {
	if e.dialect == driver.MySQL {
		return "CONCAT(" + strings.Join(exprs, ", ") + ")"
	}
	return strings.Join(exprs, " || ")
}

func event(agg string, typ string) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: typ, SchemaVersion: 1,
		Payload: []byte(`{"n":1}`), Headers: ferry.Headers{CorrelationID: "corr-" + agg, Principal: "alice", Action: "order.create", Target: "order/" + agg}}
}

func mustExec(t testing.TB, e *env, q string, args ...any) int64 {
	t.Helper()
	n, err := e.exec.Exec(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("exec %q: %v", q, err)
	}
	return n
}

func count(t testing.TB, e *env, q string, args ...any) int64 {
	t.Helper()
	rows, err := e.exec.Query(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	defer rows.Close()
	var n int64
	if !rows.Next() {
		t.Fatalf("query %q: no row", q)
	}
	if err := rows.Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func tn(base string) string { return tables.Name(base) }

// markSent marks rows sent the way the relay does (status, published_at,
// receipt), with published_at set to at.
func markSent(t testing.TB, e *env, at time.Time, eventIDs ...string) {
	t.Helper()
	for _, id := range eventIDs {
		if n := mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = $1, broker_receipt = $2, attempts = attempts + 1 WHERE event_id = $3 AND status = 'pending'`, tn("outbox")),
			at.UTC(), `{"stream":"ORDERS","seq":1}`, id); n != 1 {
			t.Fatalf("markSent %s: %d rows", id, n)
		}
	}
}

// markDead marks rows dead the way the relay's markFailed does.
func markDead(t testing.TB, e *env, eventIDs ...string) {
	t.Helper()
	for _, id := range eventIDs {
		if n := mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'dead', attempts = 5, last_error = 'broker rejected: schema' WHERE event_id = $1 AND status = 'pending'`, tn("outbox")), id); n != 1 {
			t.Fatalf("markDead %s: %d rows", id, n)
		}
	}
}

// snapshot renders every row of the given tables as text, in key order, so
// a dry run can be compared byte for byte before and after.
func snapshot(t testing.TB, e *env, bases ...string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, base := range bases {
		var q string
		switch e.dialect {
		case driver.Postgres:
			q = fmt.Sprintf(`SELECT CAST(x AS text) FROM %s x ORDER BY 1`, tn(base))
		case driver.MySQL:
			rows, err := e.exec.Query(ctx, `SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = $1 ORDER BY ordinal_position`, tables.Bare(base))
			if err != nil {
				t.Fatal(err)
			}
			var cols []string
			for rows.Next() {
				var c string
				if err := rows.Scan(&c); err != nil {
					t.Fatal(err)
				}
				cols = append(cols, "QUOTE("+c+")")
			}
			rows.Close()
			q = fmt.Sprintf(`SELECT CONCAT_WS(',', %s) AS r FROM %s ORDER BY r`, strings.Join(cols, ", "), tn(base))
		default:
			rows, err := e.exec.Query(ctx, `SELECT name FROM pragma_table_info($1) ORDER BY cid`, tables.Bare(base))
			if err != nil {
				t.Fatal(err)
			}
			var cols []string
			for rows.Next() {
				var c string
				if err := rows.Scan(&c); err != nil {
					t.Fatal(err)
				}
				cols = append(cols, "quote("+c+")")
			}
			rows.Close()
			q = fmt.Sprintf(`SELECT %s FROM %s ORDER BY 1`, strings.Join(cols, " || ',' || "), tn(base))
		}
		rows, err := e.exec.Query(ctx, q)
		if err != nil {
			t.Fatalf("snapshot %s: %v", base, err)
		}
		fmt.Fprintf(&b, "== %s\n", base)
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(s)
			b.WriteByte('\n')
		}
		rows.Close()
	}
	return b.String()
}

var approve = ops.Approval{Approve: true, Actor: "alice", Reason: "broker schema fixed in v2.3 (INC-42)"}
var preview = ops.Approval{Actor: "alice", Reason: "broker schema fixed in v2.3 (INC-42)"}
