package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// Two transactions supply the same version for one aggregate: the second
// waits for the first's row lock and, once the first commits, gets
// ErrSequenceConflict (it re-checks the committed version) with its
// transaction still usable; if the first rolls back, the second succeeds.
// The same holds for two transactions creating the same aggregate.
func TestExpectedVersionConcurrentPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pgxv5.New(s.Pool), ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(pgxv5.New(s.Pool))
	if err != nil {
		t.Fatal(err)
	}
	ev := func(agg string, seq int64) ferry.Event {
		return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, AggregateSeq: seq,
			EventType: "order.changed", SchemaVersion: 1, Payload: []byte(`{}`)}
	}
	if _, err := w.Insert(ctx, ev("o-1", 1)); err != nil {
		t.Fatal(err)
	}

	// race runs first's InsertTx, then second's in another goroutine,
	// checks that second waits, ends first with commit or rollback and
	// returns second's error (second's transaction stays open).
	race := func(e ferry.Event, commitFirst bool) (pgx.Tx, error) {
		t.Helper()
		first, err := s.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.InsertTx(ctx, first, e); err != nil {
			t.Fatalf("first: %v", err)
		}
		second, err := s.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = second.Rollback(ctx) })
		res := make(chan error, 1)
		go func() {
			_, err := w.InsertTx(ctx, second, e)
			res <- err
		}()
		select {
		case err := <-res:
			t.Fatalf("second writer of %s seq %d did not wait for the first: %v", e.AggregateID, e.AggregateSeq, err)
		case <-time.After(300 * time.Millisecond):
		}
		if commitFirst {
			err = first.Commit(ctx)
		} else {
			err = first.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-res:
			return second, err
		case <-time.After(10 * time.Second):
			t.Fatal("second writer still blocked after the first ended")
			return nil, nil
		}
	}

	wantConflict := func(err error, expected, next int64) {
		t.Helper()
		var sc *ferry.SequenceConflictError
		if !errors.As(err, &sc) || sc.Expected != expected || sc.Next != next {
			t.Fatalf("err = %v; want ErrSequenceConflict expected %d next %d", err, expected, next)
		}
	}

	// Existing aggregate, first commits: the second conflicts, then
	// continues in the same transaction with the next version.
	second, err := race(ev("o-1", 2), true)
	wantConflict(err, 2, 3)
	if out, err := w.InsertTx(ctx, second, ev("o-1", 3)); err != nil || out[0].AggregateSeq != 3 {
		t.Fatalf("second's retry in the same transaction: %v %+v", err, out)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Existing aggregate, first rolls back: the second gets the version.
	second, err = race(ev("o-1", 4), false)
	if err != nil {
		t.Fatalf("after the first rolled back: %v", err)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// New aggregate, both create it: the second conflicts.
	_, err = race(ev("o-2", 1), true)
	wantConflict(err, 1, 2)

	var seqs []int64
	rows, err := s.Pool.Query(ctx, `SELECT aggregate_seq FROM ferry_outbox WHERE aggregate_id = 'o-1' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 4 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || seqs[3] != 4 {
		t.Fatalf("o-1 sequences in commit order %v; want [1 2 3 4]", seqs)
	}
}

// BenchmarkInsertTxVersion compares, per transaction on Postgres, an event
// whose sequence Ferry allocates with one whose version the caller supplies
// (one statement each; the supplied form used to need a savepoint, i.e. two
// more round trips).
//
//	go test -run '^$' -bench InsertTxVersion ./outbox/
func BenchmarkInsertTxVersion(b *testing.B) {
	s := testenv.NewPostgresSchema(b)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pgxv5.New(s.Pool), ferry.Tables{}); err != nil {
		b.Fatal(err)
	}
	w, err := outbox.New(pgxv5.New(s.Pool))
	if err != nil {
		b.Fatal(err)
	}
	for _, supplied := range []bool{false, true} {
		name := "allocated"
		if supplied {
			name = "supplied"
		}
		b.Run(name, func(b *testing.B) {
			agg := "bench-" + uuid.NewString() // fresh per run: b.Run repeats with growing b.N
			for i := range b.N {
				e := ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg,
					EventType: "order.changed", SchemaVersion: 1, Payload: []byte(`{}`)}
				if supplied {
					e.AggregateSeq = int64(i + 1)
				}
				tx, err := s.Pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.InsertTx(ctx, tx, e); err != nil {
					_ = tx.Rollback(ctx) // or the pool's Close waits for it forever
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
