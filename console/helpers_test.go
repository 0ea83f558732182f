package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// Tokens of the test identities.
const (
	operatorToken = "tok-operator-olivia"
	viewerToken   = "tok-viewer-victor"
	agentToken    = "tok-agent-claude"
)

func testTokens(t testing.TB) *opsauth.Tokens {
	t.Helper()
	y := fmt.Sprintf("tokens:\n  - name: olivia\n    role: operator\n    sha256: %s\n  - name: victor\n    role: viewer\n    sha256: %s\n  - name: claude\n    role: operator\n    agent: true\n    sha256: %s\n",
		opsauth.HashToken(operatorToken), opsauth.HashToken(viewerToken), opsauth.HashToken(agentToken))
	tk, err := opsauth.ParseTokens([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// env is a migrated database, an outbox writer, Ops and a console server.
type env struct {
	name    string
	db      ops.DB
	exec    driver.Executor
	ops     *ops.Ops
	dialect driver.Dialect
	insert  func(t testing.TB, evs ...ferry.Event) []ferry.Event
	srv     *httptest.Server
	pg      *testenv.PostgresSchema
}

func newEnv(t testing.TB, dialect string, cfg console.Config) *env {
	t.Helper()
	if dialect == "postgres" || dialect == "postgres-partitioned" {
		s := testenv.NewPostgresSchema(t)
		if dialect == "postgres-partitioned" {
			// Daily partitions from 5 days back (the scale fill's rows
			// are up to a few days old) to the ones migrate makes ahead.
			ctx := context.Background()
			drv := pgxv5.New(s.Pool)
			if _, err := migrate.Up(ctx, drv, ferry.Tables{}, migrate.WithPartitionedOutbox(24*time.Hour)); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			today := time.Now().UTC().Truncate(24 * time.Hour)
			for d := 5; d >= 1; d-- {
				if _, err := partition.Create(ctx, drv.Executor(), ferry.Tables{}, partition.Outbox, today.Add(-time.Duration(d)*24*time.Hour), 24*time.Hour); err != nil {
					t.Fatal(err)
				}
			}
		}
		e := setup(t, "postgres", pgxv5.New(s.Pool), cfg)
		e.pg = s
		return e
	}
	if dialect == "mysql" {
		return setup(t, dialect, mysql.New(testenv.NewMySQLDatabase(t).DB), cfg)
	}
	db, _ := testenv.NewSQLite(t)
	return setup(t, dialect, sqlite.New(db), cfg)
}

func setup[TTx any](t testing.TB, name string, drv driver.Driver[TTx], cfg console.Config) *env {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	db := any(drv).(ops.DB)
	o, err := ops.New(db, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Auth == nil {
		cfg.Auth = testTokens(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := console.New(o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &env{name: name, db: db, exec: drv.Executor(), ops: o, dialect: drv.Dialect(), srv: srv,
		insert: func(t testing.TB, evs ...ferry.Event) []ferry.Event {
			t.Helper()
			out, err := w.Insert(ctx, evs...)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}}
}

func both(t *testing.T, cfg console.Config, fn func(t *testing.T, e *env)) {
	for _, d := range []string{"postgres", "sqlite", "mysql"} {
		t.Run(d, func(t *testing.T) { fn(t, newEnv(t, d, cfg)) })
	}
}

func event(agg, typ string) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: typ, SchemaVersion: 1,
		Payload: []byte(`{"amount":100}`), Headers: ferry.Headers{CorrelationID: "corr-" + agg, Principal: "alice"}}
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
	var n int64
	if _, err := driver.QueryRow(context.Background(), e.exec, q, args, &n); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	return n
}

// markDead marks rows dead the way the relay's markFailed does.
func markDead(t testing.TB, e *env, lastError string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := mustExec(t, e, `UPDATE ferry_outbox SET status = 'dead', attempts = 5, last_error = $1 WHERE event_id = $2 AND status = 'pending'`, lastError, id); n != 1 {
			t.Fatalf("markDead %s: %d rows", id, n)
		}
	}
}

// snapshot renders every row of the tables as text in key order.
func snapshot(t testing.TB, e *env, tables ...string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, tbl := range tables {
		q := fmt.Sprintf(`SELECT CAST(x AS text) FROM %s x ORDER BY 1`, tbl)
		if e.dialect == driver.MySQL {
			q = mysqlSnapshotSQL(t, e, tbl)
		} else if e.dialect != driver.Postgres {
			rows, err := e.exec.Query(ctx, `SELECT name FROM pragma_table_info($1) ORDER BY cid`, tbl)
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
			q = fmt.Sprintf(`SELECT %s FROM %s ORDER BY 1`, strings.Join(cols, " || ',' || "), tbl)
		}
		rows, err := e.exec.Query(ctx, q)
		if err != nil {
			t.Fatalf("snapshot %s: %v", tbl, err)
		}
		fmt.Fprintf(&b, "== %s\n", tbl)
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(s + "\n")
		}
		rows.Close()
	}
	return b.String()
}

// mysqlSnapshotSQL selects every column of tbl quoted, one text per row.
func mysqlSnapshotSQL(t testing.TB, e *env, tbl string) string {
	t.Helper()
	rows, err := e.exec.Query(context.Background(), `SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = $1 ORDER BY ordinal_position`, tbl)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, "QUOTE("+c+")")
	}
	return fmt.Sprintf(`SELECT CONCAT_WS(',', %s) AS r FROM %s ORDER BY r`, strings.Join(cols, ", "), tbl)
}

// call sends a request with token (none when ""), a JSON body (when not
// nil) and extra headers; it returns the status and body.
func call(t testing.TB, e *env, method, path, token string, body any, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		if s, ok := body.(string); ok {
			rd = strings.NewReader(s)
		} else {
			b, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			rd = bytes.NewReader(b)
		}
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func problem(t testing.TB, b []byte) opsauth.Problem {
	t.Helper()
	var p opsauth.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("not a problem document: %s", b)
	}
	return p
}
