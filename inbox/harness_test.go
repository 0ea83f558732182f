package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

func TestMain(m *testing.M) {
	testenv.Announce("inbox", testenv.Postgres, testenv.MySQL, testenv.NATS, testenv.RabbitMQ)
	goleak.VerifyTestMain(m, append(testenv.KnownLibraryLeaks(),
		// database/sql's connection opener and pgxpool's health check are
		// the libraries' own, stopped by Close in cleanup.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)...)
}

// store is one real database a test runs against, through database/sql
// so every scenario runs unchanged on Postgres and SQLite.
type store struct {
	name string
	drv  *databasesql.Driver
	db   *sql.DB
}

// stores returns Postgres (an isolated schema) and SQLite, migrated, with
// the test's effects table.
func stores(t *testing.T) []store {
	t.Helper()
	var out []store
	if testenv.Reachable(testenv.URL("FERRY_TEST_POSTGRES_URL", testenv.DefaultPostgresURL)) == nil || testenv.Required() {
		pg := testenv.NewPostgresSchema(t)
		db := pg.OpenSQL(t)
		out = append(out, store{name: "postgres", drv: databasesql.New(db, driver.Postgres), db: db})
	} else {
		t.Log("Postgres unreachable: SQLite only")
	}
	if testenv.Reachable(testenv.MySQLURL(t)) == nil || testenv.Required() {
		my := testenv.NewMySQLDatabase(t)
		out = append(out, store{name: "mysql", drv: mysql.New(my.DB), db: my.DB})
	} else {
		t.Log("MySQL unreachable: no mysql store")
	}
	db, _ := testenv.NewSQLite(t)
	out = append(out, store{name: "sqlite", drv: sqlite.New(db), db: db})
	for _, s := range out {
		setupStore(t, s.drv, s.db)
	}
	return out
}

func postgresStore(t *testing.T) store {
	t.Helper()
	pg := testenv.NewPostgresSchema(t)
	db := pg.OpenSQL(t)
	s := store{name: "postgres", drv: databasesql.New(db, driver.Postgres), db: db}
	setupStore(t, s.drv, s.db)
	return s
}

func mysqlStore(t *testing.T) store {
	t.Helper()
	my := testenv.NewMySQLDatabase(t)
	s := store{name: "mysql", drv: mysql.New(my.DB), db: my.DB}
	setupStore(t, s.drv, s.db)
	return s
}

func setupStore(t testing.TB, drv *databasesql.Driver, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	ddl := `CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant_id text NOT NULL,
		aggregate_id text NOT NULL, seq bigint NOT NULL, event_id text NOT NULL, payload text NOT NULL)`
	switch drv.Dialect() {
	case driver.SQLite:
		ddl = `CREATE TABLE effects (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant_id TEXT NOT NULL,
		aggregate_id TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL, payload TEXT NOT NULL)`
	case driver.MySQL:
		ddl = `CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, tenant_id VARCHAR(255) NOT NULL,
		aggregate_id VARCHAR(255) NOT NULL, seq BIGINT NOT NULL, event_id VARCHAR(64) NOT NULL, payload LONGTEXT NOT NULL)`
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		t.Fatalf("effects table: %v", err)
	}
}

// writeEffect is writeEffect on any store (the statement goes through the
// store's driver, which rewrites placeholders for MySQL).
func (s store) writeEffect(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
	_, err := s.drv.UnwrapExecutor(tx).Exec(ctx, `INSERT INTO effects (tenant_id, aggregate_id, seq, event_id, payload) VALUES ($1, $2, $3, $4, $5)`,
		ev.TenantID, ev.AggregateID, ev.AggregateSeq, ev.ID.String(), string(ev.Payload))
	return err
}

// writeEffect is the trivial handler: one row per applied event.
func writeEffect(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (tenant_id, aggregate_id, seq, event_id, payload) VALUES ($1, $2, $3, $4, $5)`,
		ev.TenantID, ev.AggregateID, ev.AggregateSeq, ev.ID.String(), string(ev.Payload))
	return err
}

func newInbox(t testing.TB, s store, h Handler[*sql.Tx], opts ...Option) *Inbox[*sql.Tx] {
	t.Helper()
	if h == nil {
		h = s.writeEffect
	}
	opts = append([]Option{WithLogger(testLogger(t)), WithBackoff(time.Millisecond, 10*time.Millisecond), WithHealInterval(50 * time.Millisecond)}, opts...)
	ib, err := New[*sql.Tx](s.drv, "shipping", h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// testLogger sends the inbox's logs to t.Log, shown for failing tests only.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func event(t testing.TB, tenant, agg string, seq int64, payload string) ferry.Event {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return ferry.Event{ID: id, TenantID: tenant, AggregateType: "order", AggregateID: agg, AggregateSeq: seq,
		EventType: "order.created", SchemaVersion: 1, ContentType: "application/json", Payload: []byte(payload),
		OccurredAt: time.Now().UTC().Truncate(time.Microsecond), Topic: "order.events",
		Headers: ferry.Headers{Principal: "user:7", Action: "order.create", Target: "order/" + agg}}
}

// settled records what the inbox did with a delivery at the broker.
type settled struct {
	mu     sync.Mutex
	acks   int
	nacks  int
	delays []time.Duration
}

func (s *settled) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acks, s.nacks
}

func delivery(ev ferry.Event, attempt int, rec *settled) *broker.Delivery {
	return &broker.Delivery{
		Event: ev, Attempt: attempt,
		Raw: broker.RawMessage{Destination: "order.events", Key: ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID),
			Headers: map[string]string{"ce-id": ev.ID.String()}, Body: ev.Payload},
		Ack: func(context.Context) error {
			rec.mu.Lock()
			rec.acks++
			rec.mu.Unlock()
			return nil
		},
		Nack: func(_ context.Context, d time.Duration) error {
			rec.mu.Lock()
			rec.nacks++
			rec.delays = append(rec.delays, d)
			rec.mu.Unlock()
			return nil
		},
	}
}

// deliver runs one delivery through the inbox's transactional core, as Run
// does for each message, and returns what the broker saw.
func deliver(t testing.TB, ib *Inbox[*sql.Tx], ev ferry.Event) (acked, nacked bool, err error) {
	t.Helper()
	rec := &settled{}
	err = ib.process(context.Background(), []*message{newMessage(delivery(ev, 0, rec))})
	a, n := rec.counts()
	return a == 1, n == 1, err
}

func mustDeliver(t testing.TB, ib *Inbox[*sql.Tx], ev ferry.Event) {
	t.Helper()
	acked, _, err := deliver(t, ib, ev)
	if err != nil || !acked {
		t.Fatalf("deliver seq %d: acked=%v err=%v", ev.AggregateSeq, acked, err)
	}
}

type effectRow struct {
	tenant, agg, eventID, payload string
	seq                           int64
}

func effects(t testing.TB, db *sql.DB) []effectRow {
	t.Helper()
	rows, err := db.Query(`SELECT tenant_id, aggregate_id, seq, event_id, payload FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []effectRow
	for rows.Next() {
		var e effectRow
		if err := rows.Scan(&e.tenant, &e.agg, &e.seq, &e.eventID, &e.payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// count runs a count query on the store through its driver ($n
// placeholders on every dialect).
func (s store) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int64
	if _, err := driver.QueryRow(context.Background(), s.drv.Executor(), query, args, &n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return int(n)
}

func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func seqs(es []effectRow) string {
	s := ""
	for i, e := range es {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(e.seq)
	}
	return s
}

func openParked(t testing.TB, ib *Inbox[*sql.Tx], reason Reason) []Parked {
	t.Helper()
	ps, err := ib.ListParked(context.Background(), ParkedFilter{Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}
