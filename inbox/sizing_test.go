package inbox

import (
	"context"
	"database/sql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
)

// warnLogger logs at Warn and above into lb.
func warnLogger(lb *testenv.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func wantLog(t *testing.T, got string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(got, p) {
			t.Errorf("log lacks %q:\n%s", p, got)
		}
	}
}

func pgxPool(t *testing.T, maxConns string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.WithParam(t, testenv.PostgresURL(t), "pool_max_conns", maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPoolSizingWarning: New warns when the pool cannot serve the workers,
// naming both numbers and the fix, through pgx and database/sql; a pool
// that can serve them logs nothing.
func TestPoolSizingWarning(t *testing.T) {
	noop := func(context.Context, pgx.Tx, ferry.Event) error { return nil }
	t.Run("pgxpool-4-workers-8", func(t *testing.T) {
		var lb testenv.Buffer
		if _, err := New[pgx.Tx](pgxv5.New(pgxPool(t, "4")), "sizing", noop, WithLogger(warnLogger(&lb))); err != nil {
			t.Fatal(err)
		}
		wantLog(t, lb.String(), "max conns 4 < inbox workers 8", "pool_max_conns>=9", "WithWorkers(3)")
	})
	t.Run("pgxpool-9-workers-8", func(t *testing.T) {
		var lb testenv.Buffer
		if _, err := New[pgx.Tx](pgxv5.New(pgxPool(t, "9")), "sizing", noop, WithLogger(warnLogger(&lb))); err != nil {
			t.Fatal(err)
		}
		if s := lb.String(); s != "" {
			t.Fatalf("sufficient pool logged:\n%s", s)
		}
	})
	sqlNoop := func(context.Context, *sql.Tx, ferry.Event) error { return nil }
	for _, c := range []struct {
		maxOpen, workers int
		warn             bool
	}{{2, 4, true}, {5, 4, false}, {0, 4, false}} {
		var lb testenv.Buffer
		db, err := sql.Open("pgx", testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(c.maxOpen)
		if _, err := New[*sql.Tx](databasesql.New(db, driver.Postgres), "sizing", sqlNoop,
			WithWorkers(c.workers), WithLogger(warnLogger(&lb))); err != nil {
			t.Fatal(err)
		}
		_ = db.Close()
		if c.warn {
			wantLog(t, lb.String(), "max conns 2 < inbox workers 4", "SetMaxOpenConns(5)", "WithWorkers(1)")
		} else if s := lb.String(); s != "" {
			t.Fatalf("database/sql max open %d, workers %d logged:\n%s", c.maxOpen, c.workers, s)
		}
	}
	// SQLite has one writer whatever the pool: no warning.
	db, _ := testenv.NewSQLite(t)
	db.SetMaxOpenConns(1)
	var lb testenv.Buffer
	if _, err := New[*sql.Tx](sqlite.New(db), "sizing", sqlNoop, WithLogger(warnLogger(&lb))); err != nil {
		t.Fatal(err)
	}
	if s := lb.String(); s != "" {
		t.Fatalf("SQLite logged:\n%s", s)
	}
}

// TestConsumerSizingWarning: Run warns when the consumer's broker limits
// do not fit the inbox's in-flight bound: a natsjs max ack pending below
// twice the bound (a restart after a crash would get few or no slots) and
// a RabbitMQ prefetch below workers × batch. The defaults log nothing.
func TestConsumerSizingWarning(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	sqlNoop := func(context.Context, *sql.Tx, ferry.Event) error { return nil }
	emb, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := natsjs.EnsureStream(context.Background(), pub.JetStream(), natsjs.StreamConfig{Name: "SIZING", Subjects: []string{"sizing.>"}}); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		opts []natsjs.ConsumerOption
		want []string
	}{
		{"natsjs-1000", []natsjs.ConsumerOption{natsjs.WithMaxAckPending(1000)},
			[]string{"max ack pending 1000 < 2 × inbox in-flight bound 776", "workers 8 × (queue 64 + batch 1) + pull batch 256", "restarted consumer gets 224", "WithMaxAckPending", ">= 1552"}},
		{"natsjs-defaults", nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cons, err := natsjs.NewConsumer(context.Background(), nc, "SIZING", c.name, c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			var lb testenv.Buffer
			ib, err := New[*sql.Tx](drv, "sizing", sqlNoop, WithLogger(warnLogger(&lb)))
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Run(cancelled, cons); err != nil {
				t.Fatal(err)
			}
			if c.want == nil {
				if s := lb.String(); s != "" {
					t.Fatalf("defaults logged:\n%s", s)
				}
				return
			}
			wantLog(t, lb.String(), c.want...)
		})
	}
	for _, c := range []struct {
		name     string
		prefetch int
		want     []string
	}{
		{"rabbitmq-prefetch-4", 4, []string{"prefetch 4 < inbox workers 8 × batch 1", "prefetch >= 8"}},
		{"rabbitmq-default", rabbitmq.DefaultPrefetch, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cons, err := rabbitmq.NewConsumer("amqp://guest:guest@127.0.0.1:1/", "q", rabbitmq.WithPrefetch(c.prefetch))
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			var lb testenv.Buffer
			ib, err := New[*sql.Tx](drv, "sizing", sqlNoop, WithLogger(warnLogger(&lb)))
			if err != nil {
				t.Fatal(err)
			}
			_ = ib.Run(cancelled, cons)
			if c.want == nil {
				if s := lb.String(); s != "" {
					t.Fatalf("default prefetch logged:\n%s", s)
				}
				return
			}
			wantLog(t, lb.String(), c.want...)
		})
	}
}
