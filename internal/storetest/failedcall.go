package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/outbox"
)

// storeState is everything a failed InsertTx call could leave behind: the
// outbox rows, every aggregate's last_seq and the business rows.
type storeState struct {
	Rows   []string         // "tenant/type/id#seq event_id", in id order
	Seqs   map[string]int64 // "tenant/type/id" -> last_seq
	Orders []string
}

func readState[TTx any](t *testing.T, h Harness[TTx]) storeState {
	t.Helper()
	ctx := context.Background()
	exec := h.Driver.Executor()
	st := storeState{Seqs: map[string]int64{}}
	for _, r := range ReadOutbox(t, exec, h.Tables) {
		st.Rows = append(st.Rows, fmt.Sprintf("%s/%s/%s#%d %s", r.Tenant, r.AggType, r.AggID, r.Seq, r.EventID))
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT tenant_id, aggregate_type, aggregate_id, last_seq FROM %s`, h.Tables.Name("aggregate_seq")))
	if err != nil {
		t.Fatalf("read aggregate_seq: %v", err)
	}
	for rows.Next() {
		var tenant, typ, id string
		var last int64
		if err := rows.Scan(&tenant, &typ, &id, &last); err != nil {
			rows.Close()
			t.Fatalf("scan aggregate_seq: %v", err)
		}
		st.Seqs[tenant+"/"+typ+"/"+id] = last
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("read aggregate_seq: %v", err)
	}
	rows, err = exec.Query(ctx, `SELECT id FROM orders ORDER BY id`)
	if err != nil {
		t.Fatalf("read orders: %v", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			t.Fatalf("scan orders: %v", err)
		}
		st.Orders = append(st.Orders, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("read orders: %v", err)
	}
	return st
}

func requireState(t *testing.T, what string, got, want storeState) {
	t.Helper()
	if !slices.Equal(got.Rows, want.Rows) || !maps.Equal(got.Seqs, want.Seqs) || !slices.Equal(got.Orders, want.Orders) {
		t.Fatalf("%s:\n got outbox %d rows %v\n     seqs %v\n     orders %v\nwant outbox %d rows %v\n     seqs %v\n     orders %v",
			what, len(got.Rows), head(got.Rows), got.Seqs, got.Orders, len(want.Rows), head(want.Rows), want.Seqs, want.Orders)
	}
}

func head(s []string) []string {
	if len(s) > 8 {
		return append(slices.Clone(s[:8]), fmt.Sprintf("… (%d more)", len(s)-8))
	}
	return s
}

// requireNextSeq inserts one event on each aggregate and checks it gets the
// next gapless sequence, i.e. the failed call left no bump behind.
func requireNextSeq[TTx any](t *testing.T, w *outbox.Writer[TTx], want map[string]int64) {
	t.Helper()
	for _, agg := range slices.Sorted(maps.Keys(want)) {
		out, err := w.Insert(context.Background(), orderEvent(agg))
		if err != nil {
			t.Fatalf("insert after the failed call on %s: %v", agg, err)
		}
		if out[0].AggregateSeq != want[agg] {
			t.Fatalf("next insert on %s got seq %d, want %d (a gap or a reuse left by the failed call)", agg, out[0].AggregateSeq, want[agg])
		}
	}
}

// addOrder returns st with business row id added, as a commit of the
// failed call's transaction keeps it.
func addOrder(st storeState, id string) storeState {
	st.Orders = slices.Sorted(slices.Values(append(slices.Clone(st.Orders), id)))
	st.Seqs = maps.Clone(st.Seqs)
	return st
}

// failedCallCases are the issue-21 cases: a failed InsertTx call must leave
// no trace. Validation failures touch nothing on every driver, so the
// transaction commits its business row. Failures the database sees leave
// the transaction usable on SQLite (the call runs under a savepoint that is
// rolled back), while on Postgres they abort it: there the commit must fail
// and nothing of the transaction survives.
func failedCallCases[TTx any](t *testing.T, setup func(t *testing.T, opts ...outbox.Option) (Harness[TTx], *outbox.Writer[TTx])) {
	ctx := context.Background()

	t.Run("DuplicateIDInOneCall", func(t *testing.T) {
		h, w := setup(t)
		if _, err := w.Insert(ctx, orderEvent("o-1")); err != nil {
			t.Fatal(err)
		}
		before := readState(t, h)
		dup := uuid.Must(uuid.NewV7())
		a, b := orderEvent("o-new"), orderEvent("o-other")
		a.ID, b.ID = dup, dup
		err := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "biz-1", "acme"); err != nil {
				return err
			}
			_, err := w.InsertTx(ctx, ttx, orderEvent("o-1"), a, orderEvent("o-1"), b)
			var ve *ferry.ValidationError
			if !errors.Is(err, ferry.ErrInvalidEvent) || !errors.As(err, &ve) || ve.Index != 3 || ve.Field != "event_id" ||
				!strings.Contains(err.Error(), "event[3].event_id") || !strings.Contains(err.Error(), "duplicate of event[1].event_id") {
				return fmt.Errorf("err = %v, want ErrInvalidEvent naming event[3].event_id as a duplicate of event[1].event_id", err)
			}
			return nil // validation wrote nothing and sent nothing: commit
		})
		if err != nil {
			t.Fatal(err)
		}
		requireState(t, "after committing a call rejected for a duplicate id", readState(t, h), addOrder(before, "biz-1"))
		requireNextSeq(t, w, map[string]int64{"o-1": 2, "o-new": 1, "o-other": 1})
	})

	t.Run("DuplicateIDAcrossCalls", func(t *testing.T) {
		h, w := setup(t)
		if _, err := w.Insert(ctx, orderEvent("o-1")); err != nil {
			t.Fatal(err)
		}
		before := readState(t, h)
		dup := orderEvent("o-2")
		dup.ID = uuid.Must(uuid.NewV7())
		var first []ferry.Event
		var callErr error
		commitErr := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "biz-1", "acme"); err != nil {
				return err
			}
			var err error
			if first, err = w.InsertTx(ctx, ttx, orderEvent("o-1"), dup); err != nil {
				return fmt.Errorf("first call: %w", err)
			}
			again := dup
			again.AggregateID = "o-3"
			// A new aggregate and an existing one come before the duplicate,
			// so a partial write would create and bump sequences.
			_, callErr = w.InsertTx(ctx, ttx, orderEvent("o-new"), orderEvent("o-1"), again)
			return nil
		})
		var de *ferry.DuplicateEventIDError
		if !errors.Is(callErr, ferry.ErrDuplicateEventID) || !errors.As(callErr, &de) || de.ID != dup.ID || de.Index != 2 {
			t.Fatalf("second call: err = %v, want ErrDuplicateEventID naming event[2] id %s", callErr, dup.ID)
		}
		if msg := callErr.Error(); !strings.Contains(msg, dup.ID.String()) || strings.Contains(msg, "(2067") {
			t.Fatalf("second call: message %q should name the id and be readable", msg)
		}
		if h.Driver.Dialect() == driver.Postgres {
			// The failed statement aborted the transaction: Commit must
			// fail and nothing of the transaction survives.
			if commitErr == nil {
				t.Fatal("commit after a failed statement succeeded on Postgres; want the aborted transaction rolled back")
			}
			requireState(t, "after the aborted transaction", readState(t, h), before)
			requireNextSeq(t, w, map[string]int64{"o-1": 2, "o-2": 1, "o-new": 1})
			return
		}
		if commitErr != nil {
			t.Fatalf("commit after the failed call: %v (the call must leave the transaction usable)", commitErr)
		}
		want := addOrder(before, "biz-1")
		want.Seqs = maps.Clone(before.Seqs)
		want.Seqs["acme/order/o-1"], want.Seqs["acme/order/o-2"] = 2, 1
		for _, e := range first {
			want.Rows = append(want.Rows, fmt.Sprintf("%s/%s/%s#%d %s", e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq, e.ID))
		}
		requireState(t, "after committing the first call and a failed second call", readState(t, h), want)
		requireNextSeq(t, w, map[string]int64{"o-1": 3, "o-2": 2, "o-new": 1})
	})

	t.Run("CancelMidCall", func(t *testing.T) {
		h, w := setup(t)
		const n, aggs = outbox.MaxEventsPerCall, 20
		name := func(i int) string { return fmt.Sprintf("c-%02d", i%aggs) }
		if _, err := w.Insert(ctx, orderEvent(name(0)), orderEvent(name(aggs-1))); err != nil {
			t.Fatal(err)
		}
		before := readState(t, h)
		events := make([]ferry.Event, n)
		for i := range events {
			events[i] = orderEvent(name(i))
		}
		callCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		cw := w
		var release func()
		if h.Driver.Dialect() == driver.SQLite || h.Driver.Dialect() == driver.MySQL {
			// SQLite runs a statement per event: cancel right after the
			// 100th statement of the call, when sequences are bumped and
			// the first rows are written. MySQL runs a statement per
			// aggregate (through this wrapper: an upsert and a read of
			// LAST_INSERT_ID()), then one per chunk of 500 events: cancel
			// after the savepoint and 12 of the 20 aggregates.
			after := 100
			if h.Driver.Dialect() == driver.MySQL {
				after = 25
			}
			var err error
			cw, err = outbox.New[TTx](&cancelAfter[TTx]{Driver: h.Driver, n: after, cancel: cancel}, outbox.WithTables(h.Tables))
			if err != nil {
				t.Fatal(err)
			}
		}
		var callErr error
		commitErr := InTx(ctx, h.Driver, func(ttx TTx, exec driver.Executor) error {
			if _, err := exec.Exec(ctx, `INSERT INTO orders (id, tenant) VALUES ($1, $2)`, "biz-1", "acme"); err != nil {
				return err
			}
			if h.Driver.Dialect() == driver.Postgres {
				// Postgres writes the call in one statement: hold the last
				// aggregate's sequence row from another transaction, so the
				// statement has upserted the other aggregates and waits for
				// that lock, and cancel while it waits.
				release = blockAndCancel(t, h, exec, "acme", "order", name(aggs-1), cancel)
			}
			_, callErr = cw.InsertTx(callCtx, ttx, events...)
			if release != nil {
				release()
			}
			return nil
		})
		if !errors.Is(callErr, context.Canceled) {
			t.Fatalf("cancelled call: err = %v, want context.Canceled", callErr)
		}
		want := map[string]int64{}
		for i := range aggs {
			want[name(i)] = 1
		}
		want[name(0)], want[name(aggs-1)] = 2, 2
		if h.Driver.Dialect() == driver.Postgres {
			if commitErr == nil {
				t.Fatal("commit after a cancelled statement succeeded on Postgres; want the aborted transaction rolled back")
			}
			requireState(t, "after the aborted transaction", readState(t, h), before)
			requireNextSeq(t, w, want)
			return
		}
		if commitErr != nil {
			t.Fatalf("commit after the cancelled call: %v (the call must leave the transaction usable)", commitErr)
		}
		requireState(t, "after committing a cancelled call", readState(t, h), addOrder(before, "biz-1"))
		requireNextSeq(t, w, want)
	})
}

// cancelAfter is the store's own driver with one change: the executor it
// gives for a caller's transaction calls cancel right after the n-th
// statement, so a test cancels a call's context at a known point mid-call.
type cancelAfter[TTx any] struct {
	driver.Driver[TTx]
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter[TTx]) UnwrapExecutor(tx TTx) driver.Executor {
	return &cancelExec{Executor: c.Driver.UnwrapExecutor(tx), left: c.n, cancel: c.cancel}
}

type cancelExec struct {
	driver.Executor
	left   int
	cancel context.CancelFunc
}

func (c *cancelExec) tick() {
	if c.left--; c.left == 0 {
		c.cancel()
	}
}

func (c *cancelExec) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	defer c.tick()
	return c.Executor.Exec(ctx, sql, args...)
}

func (c *cancelExec) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	defer c.tick()
	return c.Executor.Query(ctx, sql, args...)
}

// blockAndCancel (Postgres) locks the sequence row of one aggregate from
// another transaction, then, from a goroutine, waits until the backend of
// exec's transaction waits for a lock and calls cancel. The returned
// release ends the blocking transaction.
func blockAndCancel[TTx any](t *testing.T, h Harness[TTx], exec driver.Executor, tenant, typ, id string, cancel context.CancelFunc) (release func()) {
	t.Helper()
	ctx := context.Background()
	var pid int64
	if err := scanOne(ctx, exec, `SELECT pg_backend_pid()`, nil, &pid); err != nil {
		t.Fatal(err)
	}
	blocker, err := h.Driver.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	if err := scanOne(ctx, blocker, fmt.Sprintf(`SELECT last_seq FROM %s WHERE tenant_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE`,
		h.Tables.Name("aggregate_seq")), []any{tenant, typ, id}, &last); err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer func() { _ = blocker.Rollback(ctx) }()
		deadline := time.Now().Add(60 * time.Second)
		for {
			var waiting bool
			if err := scanOne(ctx, h.Driver.Executor(), `SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`,
				[]any{pid}, &waiting); err != nil {
				done <- err
				cancel()
				return
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				done <- errors.New("the call never waited for the blocked sequence row")
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		select { // keep the lock until the call returned, or give up
		case <-returned:
		case <-time.After(60 * time.Second):
		}
		done <- nil
	}()
	return func() {
		close(returned)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
