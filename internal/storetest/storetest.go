// Package storetest is the conformance suite every store driver runs
// (Postgres via pgx, Postgres via database/sql, SQLite), so the drivers
// cannot drift: the same tests, the same assertions, through the public API.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// versioned returns an order event of aggregate agg with a caller-supplied
// version.
func versioned(agg string, seq int64) ferry.Event {
	e := orderEvent(agg)
	e.AggregateSeq = seq
	return e
}

// Harness is one fresh, empty database for one test.
type Harness[TTx any] struct {
	Driver driver.Driver[TTx]
	Tables ferry.Tables
}

// Run runs the suite. newHarness must return an isolated empty database.
func Run[TTx any](t *testing.T, newHarness func(t *testing.T) Harness[TTx]) {
	setup := func(t *testing.T, opts ...outbox.Option) (Harness[TTx], *outbox.Writer[TTx]) {
		t.Helper()
		h := newHarness(t)
		ctx := context.Background()
		if _, err := migrate.Up(ctx, h.Driver, h.Tables); err != nil {
			t.Fatalf("migrate up: %v", err)
		}
		orders := `CREATE TABLE orders (id text PRIMARY KEY, tenant text NOT NULL)`
		if h.Driver.Dialect() == driver.MySQL { // a key cannot be text there
			orders = `CREATE TABLE orders (id varchar(255) PRIMARY KEY, tenant varchar(255) NOT NULL)`
		}
		if _, err := h.Driver.Executor().Exec(ctx, orders); err != nil {
			t.Fatalf("create orders: %v", err)
		}
		w, err := outbox.New(h.Driver, append([]outbox.Option{outbox.WithTables(h.Tables)}, opts...)...)
		if err != nil {
			t.Fatalf("outbox.New: %v", err)
		}
		return h, w
	}

	t.Run("Migrations", func(t *testing.T) {
		h := newHarness(t)
		ctx := context.Background()
		st, err := migrate.CurrentStatus(ctx, h.Driver, h.Tables)
		if err != nil {
			t.Fatal(err)
		}
		if st.Current != 0 || len(st.Pending) == 0 {
			t.Fatalf("empty db: status %+v, want current 0 and pending migrations", st)
		}
		ran, err := migrate.Up(ctx, h.Driver, h.Tables)
		if err != nil {
			t.Fatal(err)
		}
		if len(ran) != len(st.Pending) {
			t.Fatalf("up applied %d migrations, want %d", len(ran), len(st.Pending))
		}
		again, err := migrate.Up(ctx, h.Driver, h.Tables)
		if err != nil {
			t.Fatal(err)
		}
		if len(again) != 0 {
			t.Fatalf("second up applied %d migrations, want 0 (no-op)", len(again))
		}
		st, err = migrate.CurrentStatus(ctx, h.Driver, h.Tables)
		if err != nil {
			t.Fatal(err)
		}
		if st.Current != st.Latest || st.Latest < 1 || len(st.Pending) != 0 || len(st.Applied) != len(ran) {
			t.Fatalf("after up: %+v", st)
		}
	})

	t.Run("CommitWritesExactlyTheEvents", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		given := uuid.Must(uuid.NewV7())
		var written []ferry.Event
		err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "o-1", "acme"); err != nil {
				return err
			}
			var err error
			written, err = w.InsertTx(ctx, ttx,
				ferry.Event{ID: given, TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{"n":1}`),
					Headers: ferry.Headers{CorrelationID: "c-1", Principal: "user:7", Action: "order.create", Target: "order/o-1",
						Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
				ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", SchemaVersion: 2},
				ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: "c-9", EventType: "customer.updated", SchemaVersion: 1, Topic: "custom.topic"},
			)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if written[0].ID != given {
			t.Fatalf("given id not kept: %v", written[0].ID)
		}
		if written[1].ID == uuid.Nil || written[1].ID.Version() != 7 {
			t.Fatalf("assigned id %v is not a UUIDv7", written[1].ID)
		}
		if written[0].AggregateSeq != 1 || written[1].AggregateSeq != 2 || written[2].AggregateSeq != 1 {
			t.Fatalf("seqs = %d,%d,%d want 1,2,1", written[0].AggregateSeq, written[1].AggregateSeq, written[2].AggregateSeq)
		}
		if written[0].Topic != "order.events" || written[2].Topic != "custom.topic" {
			t.Fatalf("topics = %q, %q", written[0].Topic, written[2].Topic)
		}
		if want := ferry.ShardFor("acme", "order", "o-1", w.ShardCount()); written[0].Shard != want {
			t.Fatalf("shard = %d, want %d", written[0].Shard, want)
		}
		rows := ReadOutbox(t, h.Driver.Executor(), h.Tables)
		if len(rows) != 3 {
			t.Fatalf("outbox has %d rows, want 3", len(rows))
		}
		r := rows[0]
		if r.EventID != given.String() || r.Tenant != "acme" || r.AggType != "order" || r.AggID != "o-1" || r.Seq != 1 ||
			r.Type != "order.created" || r.Version != 1 || string(r.Payload) != `{"n":1}` || r.ContentType != "application/json" ||
			r.Status != "pending" || r.Correlation != "c-1" || r.Principal != "user:7" || r.Action != "order.create" ||
			r.Target != "order/o-1" || !strings.HasPrefix(r.Traceparent, "00-4bf9") || r.ShardCount != w.ShardCount() {
			t.Fatalf("row 0 = %+v", r)
		}
		if rows[1].Version != 2 || rows[1].Seq != 2 || len(rows[1].Payload) != 0 {
			t.Fatalf("row 1 = %+v", rows[1])
		}
	})

	t.Run("RollbackByErrorWritesNothing", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		boom := errors.New("business rule failed")
		err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "o-1", "acme"); err != nil {
				return err
			}
			if _, err := w.InsertTx(ctx, ttx, orderEvent("o-1")); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		assertCounts(t, h, 0, 0)
	})

	t.Run("RollbackByPanicWritesNothing", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("expected the panic to propagate")
				}
			}()
			_ = InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
				if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "o-1", "acme"); err != nil {
					return err
				}
				if _, err := w.InsertTx(ctx, ttx, orderEvent("o-1")); err != nil {
					return err
				}
				panic("handler bug")
			})
		}()
		assertCounts(t, h, 0, 0)
	})

	t.Run("ConcurrentWritersGetGaplessSequencesInCommitOrder", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		const workers, aggregates = 16, 5
		perWorker := 200
		if h.Driver.Dialect() == driver.SQLite {
			// SQLite admits one writer at a time, and its busy handler
			// is not fair: under -race on a loaded CI machine (20-40 ms
			// a transaction) one writer once lost every retry for the
			// whole 60 s busy timeout, 137 s into the run. A quarter of
			// the transactions interleave the same 16 writers.
			perWorker = 50
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		countSQL := fmt.Sprintf(`SELECT count(*) FROM %s WHERE tenant_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND event_id <> $4`, h.Tables.Name("outbox"))
		for g := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWorker {
					agg := fmt.Sprintf("agg-%d", (g+i)%aggregates)
					err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
						out, err := w.InsertTx(ctx, ttx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: "order.touched", SchemaVersion: 1})
						if err != nil {
							return err
						}
						// After the insert this transaction holds the aggregate's
						// lock, so a fresh statement sees exactly the rows
						// committed before it. Commit order = sequence order
						// means that is precisely seq-1 rows.
						var committed int64
						if err := scanOne(ctx, exec, countSQL, []any{"acme", "order", agg, out[0].ID.String()}, &committed); err != nil {
							return err
						}
						if committed != out[0].AggregateSeq-1 {
							return fmt.Errorf("%s seq %d: %d rows committed before it, want %d", agg, out[0].AggregateSeq, committed, out[0].AggregateSeq-1)
						}
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		rows := ReadOutbox(t, h.Driver.Executor(), h.Tables)
		if len(rows) != workers*perWorker {
			t.Fatalf("%d rows, want %d", len(rows), workers*perWorker)
		}
		seqs := map[string][]int64{}
		for _, r := range rows {
			seqs[r.AggID] = append(seqs[r.AggID], r.Seq)
		}
		for agg, s := range seqs {
			seen := map[int64]bool{}
			for _, v := range s {
				if seen[v] {
					t.Fatalf("%s: duplicate seq %d", agg, v)
				}
				seen[v] = true
			}
			for v := int64(1); v <= int64(len(s)); v++ {
				if !seen[v] {
					t.Fatalf("%s: gap at seq %d (have %d events)", agg, v, len(s))
				}
			}
		}
	})

	t.Run("ExpectedVersion", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		ev := func(seq int64) ferry.Event { return versioned("o-1", seq) }
		if _, err := w.Insert(ctx, ev(1), ev(2)); err != nil {
			t.Fatalf("matching versions: %v", err)
		}
		err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "o-x", "acme"); err != nil {
				return err
			}
			_, err := w.InsertTx(ctx, ttx, orderEvent("o-2"), ev(2))
			var sc *ferry.SequenceConflictError
			if !errors.Is(err, ferry.ErrSequenceConflict) || !errors.As(err, &sc) || sc.Expected != 2 || sc.Next != 3 {
				return fmt.Errorf("stale version: err = %v, want ErrSequenceConflict expected 2 next 3", err)
			}
			// The caller's transaction is still usable and nothing of the
			// failed call was written, not even o-2's sequence.
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rows := ReadOutbox(t, h.Driver.Executor(), h.Tables)
		if len(rows) != 2 {
			t.Fatalf("outbox has %d rows after conflict, want 2", len(rows))
		}
		out, err := w.Insert(ctx, orderEvent("o-2"), ev(3))
		if err != nil {
			t.Fatal(err)
		}
		if out[0].AggregateSeq != 1 || out[1].AggregateSeq != 3 {
			t.Fatalf("after conflict: seqs %d, %d; want 1, 3 (no silent renumbering, no leaked bump)", out[0].AggregateSeq, out[1].AggregateSeq)
		}
		if _, err := w.Insert(ctx, ev(9)); !errors.Is(err, ferry.ErrSequenceConflict) {
			t.Fatalf("future version: err = %v, want ErrSequenceConflict", err)
		}
		if _, err := w.Insert(ctx, ev(4), orderEvent("o-1")); !errors.Is(err, ferry.ErrInvalidEvent) {
			t.Fatalf("mixed supplied/allocated in one aggregate: err = %v, want ErrInvalidEvent", err)
		}
	})

	// One aggregate with supplied versions (on Postgres: one statement, no
	// savepoint): a mismatch writes nothing, names the next version, and
	// leaves the caller's transaction usable.
	t.Run("ExpectedVersionOneAggregate", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		ev := func(seq int64) ferry.Event { return versioned("o-1", seq) }
		conflict := func(err error, expected, next int64) error {
			var sc *ferry.SequenceConflictError
			if !errors.Is(err, ferry.ErrSequenceConflict) || !errors.As(err, &sc) || sc.Expected != expected || sc.Next != next ||
				sc.AggregateID != "o-1" {
				return fmt.Errorf("err = %v, want ErrSequenceConflict expected %d next %d", err, expected, next)
			}
			return nil
		}
		if out, err := w.Insert(ctx, ev(1)); err != nil || out[0].AggregateSeq != 1 {
			t.Fatalf("create with version 1: %v %+v", err, out)
		}
		if _, err := w.Insert(ctx, ev(1)); conflict(err, 1, 2) != nil {
			t.Fatalf("creating an existing aggregate: %v", conflict(err, 1, 2))
		}
		if out, err := w.Insert(ctx, ev(2), ev(3)); err != nil || out[0].AggregateSeq != 2 || out[1].AggregateSeq != 3 {
			t.Fatalf("versions 2, 3: %v %+v", err, out)
		}
		err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := w.InsertTx(ctx, ttx, ev(3)); conflict(err, 3, 4) != nil {
				return fmt.Errorf("stale: %w", conflict(err, 3, 4))
			}
			if _, err := w.InsertTx(ctx, ttx, ev(9)); conflict(err, 9, 4) != nil {
				return fmt.Errorf("future: %w", conflict(err, 9, 4))
			}
			// Still usable: the right version goes through in the same
			// transaction, with a business write.
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "o-1", "acme"); err != nil {
				return err
			}
			out, err := w.InsertTx(ctx, ttx, ev(4))
			if err != nil || out[0].AggregateSeq != 4 {
				return fmt.Errorf("version 4 after conflicts: %v %+v", err, out)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rows := ReadOutbox(t, h.Driver.Executor(), h.Tables)
		if len(rows) != 4 {
			t.Fatalf("outbox has %d rows, want 4 (conflicts wrote nothing)", len(rows))
		}
		for i, r := range rows {
			if r.Seq != int64(i+1) {
				t.Fatalf("row %d has seq %d: %+v", i, r.Seq, rows)
			}
		}
		if out, err := w.Insert(ctx, orderEvent("o-1")); err != nil || out[0].AggregateSeq != 5 {
			t.Fatalf("allocated after supplied: %v %+v; want seq 5", err, out)
		}
	})

	t.Run("DuplicateEventID", func(t *testing.T) {
		h, w := setup(t)
		ctx := context.Background()
		e := orderEvent("o-1")
		e.ID = uuid.Must(uuid.NewV7())
		if _, err := w.Insert(ctx, e); err != nil {
			t.Fatal(err)
		}
		e.AggregateID = "o-2"
		if _, err := w.Insert(ctx, e); !errors.Is(err, ferry.ErrDuplicateEventID) {
			t.Fatalf("err = %v, want ErrDuplicateEventID", err)
		}
		if n := len(ReadOutbox(t, h.Driver.Executor(), h.Tables)); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})

	t.Run("FailedCallLeavesNoTrace", func(t *testing.T) { failedCallCases(t, setup) })

	t.Run("ValidationRejectsAndWritesNothing", func(t *testing.T) {
		h, w := setup(t, outbox.WithLimits(ferry.Limits{MaxPayloadBytes: 1024}))
		ctx := context.Background()
		for _, c := range ValidationCases() {
			bad := orderEvent("o-1")
			c.Mutate(&bad)
			_, err := w.Insert(ctx, orderEvent("o-ok"), bad)
			var ve *ferry.ValidationError
			if !errors.Is(err, ferry.ErrInvalidEvent) || !errors.As(err, &ve) {
				t.Fatalf("%s: err = %v, want ErrInvalidEvent", c.Name, err)
			}
			if ve.Field != c.Field || ve.Index != 1 {
				t.Fatalf("%s: error names event[%d].%s, want event[1].%s: %v", c.Name, ve.Index, ve.Field, c.Field, err)
			}
		}
		assertCounts(t, h, 0, -1)
	})
}

// ValidationCase is one rule the writer must enforce.
type ValidationCase struct {
	Name   string
	Field  string
	Mutate func(*ferry.Event)
}

// ValidationCases lists every validation rule with an event that breaks it
// (payload limit assumes MaxPayloadBytes 1024).
func ValidationCases() []ValidationCase {
	long := strings.Repeat("x", 200)
	return []ValidationCase{
		{"empty tenant", "tenant_id", func(e *ferry.Event) { e.TenantID = "" }},
		{"tenant with space", "tenant_id", func(e *ferry.Event) { e.TenantID = "ac me" }},
		{"tenant too long", "tenant_id", func(e *ferry.Event) { e.TenantID = long }},
		{"empty aggregate type", "aggregate_type", func(e *ferry.Event) { e.AggregateType = "" }},
		{"aggregate type with slash", "aggregate_type", func(e *ferry.Event) { e.AggregateType = "a/b" }},
		{"empty aggregate id", "aggregate_id", func(e *ferry.Event) { e.AggregateID = "" }},
		{"aggregate id too long", "aggregate_id", func(e *ferry.Event) { e.AggregateID = long }},
		{"aggregate id control char", "aggregate_id", func(e *ferry.Event) { e.AggregateID = "a\nb" }},
		{"negative seq", "aggregate_seq", func(e *ferry.Event) { e.AggregateSeq = -1 }},
		{"empty event type", "event_type", func(e *ferry.Event) { e.EventType = "" }},
		{"schema version 0", "schema_version", func(e *ferry.Event) { e.SchemaVersion = 0 }},
		{"unknown content type", "content_type", func(e *ferry.Event) { e.ContentType = "application/x-evil" }},
		{"payload too large", "payload", func(e *ferry.Event) { e.Payload = make([]byte, 1025) }},
		{"bad topic", "topic", func(e *ferry.Event) { e.Topic = "orders;DROP TABLE" }},
		{"topic too long", "topic", func(e *ferry.Event) { e.Topic = strings.Repeat("t", 250) }},
		{"bad traceparent", "headers.traceparent", func(e *ferry.Event) { e.Headers.Traceparent = "nope" }},
		{"header too large", "headers.correlation_id", func(e *ferry.Event) { e.Headers.CorrelationID = strings.Repeat("c", 1025) }},
		{"header control char", "headers.principal", func(e *ferry.Event) { e.Headers.Principal = "a\x00b" }},
		{"occurred_at year 1", "occurred_at", func(e *ferry.Event) { e.OccurredAt = time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC) }},
		{"uuid v1", "event_id", func(e *ferry.Event) { e.ID = uuid.Must(uuid.Parse("6ba7b810-9dad-11d1-80b4-00c04fd430c8")) }},
	}
}

func orderEvent(id string) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id, EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}
}

func assertCounts[TTx any](t *testing.T, h Harness[TTx], outboxRows, orders int) {
	t.Helper()
	ctx := context.Background()
	var n int64
	if err := scanOne(ctx, h.Driver.Executor(), fmt.Sprintf(`SELECT count(*) FROM %s`, h.Tables.Name("outbox")), nil, &n); err != nil {
		t.Fatal(err)
	}
	if n != int64(outboxRows) {
		t.Fatalf("outbox has %d rows, want %d", n, outboxRows)
	}
	if err := scanOne(ctx, h.Driver.Executor(), fmt.Sprintf(`SELECT count(*) FROM %s`, h.Tables.Name("aggregate_seq")), nil, &n); err != nil {
		t.Fatal(err)
	}
	if outboxRows == 0 && n != 0 {
		t.Fatalf("aggregate_seq has %d rows, want 0 (a failed call must not bump sequences)", n)
	}
	if orders >= 0 {
		if err := scanOne(ctx, h.Driver.Executor(), `SELECT count(*) FROM orders`, nil, &n); err != nil {
			t.Fatal(err)
		}
		if n != int64(orders) {
			t.Fatalf("orders has %d rows, want %d", n, orders)
		}
	}
}

// InTx runs fn in a transaction: commit on nil, rollback on error or panic
// (the panic is re-raised after the rollback).
func InTx[TTx any](ctx context.Context, drv driver.Driver[TTx], fn func(TTx, driver.Executor) error) (err error) {
	ttx, tx, err := drv.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(ctx)
			panic(p)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
		}
	}()
	if err = fn(ttx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func scanOne(ctx context.Context, exec driver.Executor, q string, args []any, dest ...any) error {
	found, err := driver.QueryRow(ctx, exec, q, args, dest...)
	if err == nil && !found {
		return fmt.Errorf("no rows for %q", q)
	}
	return err
}

// Row is an outbox row as the tests read it back.
type Row struct {
	EventID, Tenant, AggType, AggID string
	Seq                             int64
	Type                            string
	Version                         int
	Topic                           string
	Shard, ShardCount               int
	ContentType                     string
	Payload                         []byte
	Status                          string
	Traceparent, Correlation        string
	Principal, Action, Target       string
}

// ReadOutbox returns every outbox row in id order.
func ReadOutbox(t testing.TB, exec driver.Executor, tables ferry.Tables) []Row {
	t.Helper()
	eventID := "CAST(event_id AS text)"
	if exec.Dialect() == driver.MySQL {
		eventID = "event_id"
	}
	q := fmt.Sprintf(`SELECT %s, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
		topic, shard, shard_count, content_type, payload, status, traceparent, correlation_id, principal, action, target
		FROM %s ORDER BY id`, eventID, tables.Name("outbox"))
	rows, err := exec.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.EventID, &r.Tenant, &r.AggType, &r.AggID, &r.Seq, &r.Type, &r.Version, &r.Topic, &r.Shard, &r.ShardCount,
			&r.ContentType, &r.Payload, &r.Status, &r.Traceparent, &r.Correlation, &r.Principal, &r.Action, &r.Target); err != nil {
			t.Fatalf("scan outbox: %v", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	return out
}
