package command_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/command"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func setup[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	ddl := `CREATE TABLE orders (id text PRIMARY KEY, tenant text NOT NULL, body text NOT NULL)`
	if drv.Dialect() == driver.MySQL {
		ddl = `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, tenant text NOT NULL, body text NOT NULL)`
	}
	if _, err := drv.Executor().Exec(ctx, ddl); err != nil {
		t.Fatalf("create orders: %v", err)
	}
}

func count(t *testing.T, exec driver.Executor, q string, args ...any) int64 {
	t.Helper()
	rows, err := exec.Query(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var n int64
	if rows.Next() {
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// runSuite is the command idempotency suite, run against every driver.
func runSuite[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	t.Run("ConcurrentRetriesRunOnce", func(t *testing.T) {
		drv := newDriver(t)
		setup(t, drv)
		ctx := context.Background()
		r, err := command.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		w, err := outbox.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		executions := 0
		body := []byte(`{"item":"book","qty":1}`)
		fn := func(ctx context.Context, tx TTx) (command.Result, error) {
			mu.Lock()
			executions++
			mu.Unlock()
			orderID := uuid.NewString()
			if _, err := drv.UnwrapExecutor(tx).Exec(ctx, `INSERT INTO orders (id, tenant, body) VALUES ($1, $2, $3)`, orderID, "acme", string(body)); err != nil {
				return command.Result{}, err
			}
			evs, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: orderID,
				EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)})
			if err != nil {
				return command.Result{}, err
			}
			// Widen the race window: the others must be waiting on our row.
			time.Sleep(50 * time.Millisecond)
			return command.Result{Body: []byte(`{"order":"` + orderID + `"}`), EventIDs: []uuid.UUID{evs[0].ID}}, nil
		}
		const callers = 20
		outs := make([]command.Outcome, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				outs[i], errs[i] = r.Run(ctx, command.Request{TenantID: "acme", Key: "order-key-1", Body: body}, fn)
			}()
		}
		close(start)
		wg.Wait()
		fresh := 0
		for i := range callers {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			if !outs[i].Replayed {
				fresh++
			}
			if string(outs[i].Body) != string(outs[0].Body) || len(outs[i].EventIDs) != 1 || outs[i].EventIDs[0] != outs[0].EventIDs[0] {
				t.Fatalf("caller %d got %s %v, caller 0 got %s %v", i, outs[i].Body, outs[i].EventIDs, outs[0].Body, outs[0].EventIDs)
			}
		}
		if executions != 1 || fresh != 1 {
			t.Fatalf("command executed %d times, %d fresh outcomes; want 1 and 1", executions, fresh)
		}
		if n := count(t, drv.Executor(), `SELECT count(*) FROM orders`); n != 1 {
			t.Fatalf("orders = %d, want 1", n)
		}
		if n := count(t, drv.Executor(), `SELECT count(*) FROM ferry_outbox`); n != 1 {
			t.Fatalf("events = %d, want 1", n)
		}
		if n := count(t, drv.Executor(), `SELECT count(*) FROM ferry_outbox WHERE event_id = $1`, outs[0].EventIDs[0].String()); n != 1 {
			t.Fatalf("stored event id %s not in the outbox", outs[0].EventIDs[0])
		}
	})

	t.Run("ReusedKeyOtherBody", func(t *testing.T) {
		drv := newDriver(t)
		setup(t, drv)
		ctx := context.Background()
		r, err := command.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		fn := func(ctx context.Context, tx TTx) (command.Result, error) {
			ran++
			return command.Result{Body: []byte("ok")}, nil
		}
		if _, err := r.Run(ctx, command.Request{TenantID: "acme", Key: "k", Body: []byte("a")}, fn); err != nil {
			t.Fatal(err)
		}
		_, err = r.Run(ctx, command.Request{TenantID: "acme", Key: "k", Body: []byte("b")}, fn)
		var kr *command.KeyReusedError
		if !errors.Is(err, command.ErrIdempotencyKeyReused) || !errors.As(err, &kr) || kr.Key != "k" || kr.TenantID != "acme" {
			t.Fatalf("reused key: err = %v, want ErrIdempotencyKeyReused naming key k", err)
		}
		if !strings.Contains(err.Error(), `"k"`) {
			t.Fatalf("error %q does not name the key", err)
		}
		// Another tenant may use the same key.
		if out, err := r.Run(ctx, command.Request{TenantID: "other", Key: "k", Body: []byte("b")}, fn); err != nil || out.Replayed {
			t.Fatalf("other tenant: %+v, %v", out, err)
		}
		if ran != 2 {
			t.Fatalf("ran %d times, want 2", ran)
		}
	})

	t.Run("FailedCommandStoresNothing", func(t *testing.T) {
		drv := newDriver(t)
		setup(t, drv)
		ctx := context.Background()
		r, err := command.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		ran := 0
		fail := func(ctx context.Context, tx TTx) (command.Result, error) {
			ran++
			if _, err := drv.UnwrapExecutor(tx).Exec(ctx, `INSERT INTO orders (id, tenant, body) VALUES ('o1', 'acme', 'x')`); err != nil {
				return command.Result{}, err
			}
			return command.Result{}, boom
		}
		req := command.Request{TenantID: "acme", Key: "k", Body: []byte("a")}
		if _, err := r.Run(ctx, req, fail); !errors.Is(err, boom) {
			t.Fatalf("err = %v, want boom", err)
		}
		if n := count(t, drv.Executor(), `SELECT count(*) FROM ferry_command_keys`); n != 0 {
			t.Fatalf("keys stored after failure: %d", n)
		}
		if n := count(t, drv.Executor(), `SELECT count(*) FROM orders`); n != 0 {
			t.Fatalf("orders after failure: %d", n)
		}
		out, err := r.Run(ctx, req, func(ctx context.Context, tx TTx) (command.Result, error) {
			ran++
			return command.Result{Body: []byte("ok")}, nil
		})
		if err != nil || out.Replayed || string(out.Body) != "ok" || ran != 2 {
			t.Fatalf("retry after failure: %+v %v ran=%d; want a fresh run", out, err, ran)
		}
	})

	t.Run("ExpiryAndCleanup", func(t *testing.T) {
		drv := newDriver(t)
		setup(t, drv)
		ctx := context.Background()
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		r, err := command.New(drv, command.WithExpiry(time.Hour), command.WithReplayWindow(time.Hour), command.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		fn := func(ctx context.Context, tx TTx) (command.Result, error) { ran++; return command.Result{}, nil }
		for i := range 25 {
			if _, err := r.Run(ctx, command.Request{Key: fmt.Sprintf("k%d", i), Body: []byte("x")}, fn); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(30 * time.Minute)
		if out, err := r.Run(ctx, command.Request{Key: "k0", Body: []byte("x")}, fn); err != nil || !out.Replayed {
			t.Fatalf("within expiry: %+v %v", out, err)
		}
		if n, err := r.Cleanup(ctx, 10); err != nil || n != 0 {
			t.Fatalf("cleanup before expiry deleted %d (%v)", n, err)
		}
		now = now.Add(31 * time.Minute)
		if out, err := r.Run(ctx, command.Request{Key: "k0", Body: []byte("x")}, fn); err != nil || out.Replayed {
			t.Fatalf("after expiry: %+v %v, want a fresh run", out, err)
		}
		n, err := r.Cleanup(ctx, 10)
		if err != nil || n != 24 {
			t.Fatalf("cleanup deleted %d (%v), want 24 (k0 was re-run)", n, err)
		}
		if ran != 26 {
			t.Fatalf("ran %d, want 26", ran)
		}
	})
}

func TestMain(m *testing.M) {
	testenv.Announce("command", testenv.Postgres, testenv.MySQL)
	goleak.VerifyTestMain(m)
}

// TestNegativeControlWithoutRunner runs the same 20 concurrent retries with
// the command called directly: 20 orders and 20 events. It proves the
// one-order assertion of ConcurrentRetriesRunOnce can fail.
func TestNegativeControlWithoutRunner(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	setup(t, drv)
	ctx := context.Background()
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := s.Pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			id := uuid.NewString()
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id, tenant, body) VALUES ($1, 'acme', 'x')`, id); err != nil {
				t.Error(err)
				return
			}
			if _, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id,
				EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}); err != nil {
				t.Error(err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := count(t, drv.Executor(), `SELECT count(*) FROM orders`); n <= 1 {
		t.Fatalf("without idempotency keys 20 retries made %d orders; the check cannot fail", n)
	}
}

func TestPgx(t *testing.T) {
	runSuite(t, func(t *testing.T) driver.Driver[pgx.Tx] { return pgxv5.New(testenv.NewPostgresSchema(t).Pool) })
}

func TestDatabaseSQLPostgres(t *testing.T) {
	runSuite(t, func(t *testing.T) driver.Driver[*sql.Tx] {
		return databasesql.New(testenv.NewPostgresSchema(t).OpenSQL(t), driver.Postgres)
	})
}

func TestMySQL(t *testing.T) {
	runSuite(t, func(t *testing.T) driver.Driver[*sql.Tx] {
		return mysql.New(testenv.NewMySQLDatabase(t).DB)
	})
}

func TestSQLite(t *testing.T) {
	runSuite(t, func(t *testing.T) driver.Driver[*sql.Tx] {
		db, _ := testenv.NewSQLite(t)
		return sqlite.New(db)
	})
}

func TestExpiryShorterThanReplayWindowRefused(t *testing.T) {
	_, err := command.New(sqlite.New(nil), command.WithExpiry(time.Hour), command.WithReplayWindow(2*time.Hour))
	if !errors.Is(err, ferry.ErrInvalidConfig) || !strings.Contains(err.Error(), "1h0m0s") || !strings.Contains(err.Error(), "2h0m0s") {
		t.Fatalf("err = %v, want a config error naming 1h0m0s and 2h0m0s", err)
	}
}

func TestRequestValidation(t *testing.T) {
	r, err := command.New(sqlite.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Run(context.Background(), command.Request{Key: strings.Repeat("k", 256)}, nil)
	var re *command.RequestError
	if !errors.As(err, &re) || re.Field != "key" || !strings.Contains(err.Error(), "255") {
		t.Fatalf("err = %v, want key limit error", err)
	}
}
