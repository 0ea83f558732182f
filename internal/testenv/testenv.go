// Package testenv finds the services tests run against and gives each test
// an isolated place in them. A test that needs a server calls one of these;
// when the server is absent the test is skipped with a one-line reason,
// unless FERRY_REQUIRE_SERVICES=1, where absence fails the test (CI).
//
// Servers are found through FERRY_TEST_POSTGRES_URL, FERRY_TEST_NATS_URL,
// FERRY_TEST_RABBITMQ_URL, FERRY_TEST_MYSQL_URL, defaulting to the loopback
// services.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults for the loopback services of the development machine.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"
)

// Required reports whether FERRY_REQUIRE_SERVICES=1.
func Required() bool { return os.Getenv("FERRY_REQUIRE_SERVICES") == "1" }

// Unavailable skips t, or fails it when services are required.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("required service unavailable (FERRY_REQUIRE_SERVICES=1): %s", msg)
	}
	t.Skipf("service unavailable: %s", msg)
}

// URL returns the value of env or def.
func URL(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// WithParam returns rawURL with the query parameter key set to value
// (e.g. a Postgres URL with pool_max_conns), whether or not it already
// has a query.
func WithParam(t testing.TB, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("testenv: parse url: %v", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// Reachable dials the host:port of rawURL.
func Reachable(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	host := u.Host
	if host == "" {
		host = rawURL
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Service returns the URL of a server from env (or def), after checking it
// answers on TCP; it skips or fails t otherwise.
func Service(t testing.TB, name, env, def string) string {
	t.Helper()
	u := URL(env, def)
	if err := Reachable(u); err != nil {
		Unavailable(t, "%s at %s (%s): %v", name, redact(u), env, err)
	}
	return u
}

// NATSURL returns the NATS server URL (JetStream enabled).
func NATSURL(t testing.TB) string {
	return Service(t, "NATS", "FERRY_TEST_NATS_URL", DefaultNATSURL)
}

// RabbitMQURL returns the RabbitMQ AMQP URL.
func RabbitMQURL(t testing.TB) string {
	return Service(t, "RabbitMQ", "FERRY_TEST_RABBITMQ_URL", DefaultRabbitMQURL)
}

// PostgresURL returns the Postgres URL after checking a connection works.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := URL("FERRY_TEST_POSTGRES_URL", DefaultPostgresURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err == nil {
		err = pool.Ping(ctx)
		pool.Close()
	}
	if err != nil {
		Unavailable(t, "Postgres at %s (FERRY_TEST_POSTGRES_URL): %v", redact(u), err)
	}
	return u
}

// PostgresSchema is an isolated schema for one test.
type PostgresSchema struct {
	// URL connects with search_path set to Schema, so unqualified names
	// (Ferry's default) land in it.
	URL    string
	Schema string
	Pool   *pgxpool.Pool
}

// NewPostgresSchema creates a fresh schema, a pool whose search_path is that
// schema, and registers cleanup that closes the pool and drops the schema.
func NewPostgresSchema(t testing.TB) *PostgresSchema {
	t.Helper()
	return NewPostgresSchemaAt(t, PostgresURL(t))
}

// NewPostgresSchemaAt is NewPostgresSchema on the server at base (e.g. a
// ThrowawayPostgres's URL).
func NewPostgresSchemaAt(t testing.TB, base string) *PostgresSchema {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := "ferry_test_" + randHex(6)
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %q`, schema)); err != nil {
		t.Fatalf("testenv: create schema: %v", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse url: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatalf("testenv: connect schema: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgxpool.New(ctx, base)
		if err != nil {
			t.Errorf("testenv: cleanup connect: %v", err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec(ctx, fmt.Sprintf(`DROP SCHEMA %q CASCADE`, schema)); err != nil {
			t.Errorf("testenv: drop schema %s: %v", schema, err)
		}
	})
	return &PostgresSchema{URL: u.String(), Schema: schema, Pool: pool}
}

// OpenSQL opens a database/sql handle (pgx stdlib) on the schema; closed at cleanup.
func (s *PostgresSchema) OpenSQL(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", s.URL)
	if err != nil {
		t.Fatalf("testenv: open sql: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// NewSQLite opens a fresh SQLite database in t's temp dir; closed at cleanup.
func NewSQLite(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ferry.db")
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, path
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// redact hides a password in a URL for messages (internal/logattr's one
// rule).
func redact(raw string) string { return logattr.RedactURL(raw) }
