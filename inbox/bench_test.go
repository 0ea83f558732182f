package inbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
)

// BenchmarkConsumePostgresNATS measures the apply rate from JetStream into
// Postgres (pgx) with a handler that writes one row: b.N events over 1,000
// aggregates are published first, then the timer runs while the inbox
// applies them all. Reported as events/s.
//
//	go test ./inbox -run XXX -bench ConsumePostgresNATS -benchtime 20000x
func BenchmarkConsumePostgresNATS(b *testing.B) {
	for _, mode := range []struct {
		name  string
		batch int
	}{{"tx-per-message", 1}, {"batch-100", 100}, {"batch-500", 500}} {
		b.Run(mode.name, func(b *testing.B) {
			s := newNATSStack(b, "")
			evs := benchEvents(b, b.N, 1000)
			for i := range evs {
				evs[i].Topic = s.subject
			}
			for lo := 0; lo < len(evs); lo += 1000 {
				for _, r := range s.pub.Publish(context.Background(), evs[lo:min(lo+1000, len(evs))]) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			ib, err := New[pgx.Tx](s.drv, "bench", pgxEffect, WithBatch(mode.batch, 2*time.Millisecond),
				WithWorkers(8), WithQueue(256), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				b.Fatal(err)
			}
			c := s.consumer(b)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			start := time.Now()
			go func() { done <- ib.Run(ctx, c) }()
			for ib.Stats().Applied < int64(b.N) {
				select {
				case err := <-done:
					b.Fatalf("consumer stopped early: %v", err)
				case <-time.After(2 * time.Millisecond):
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}

// BenchmarkInboxOverhead compares, on Postgres through pgx, a transaction
// that only runs the handler (one INSERT) with the same transaction run
// through the inbox (claim + cursor + handler): the difference is the
// inbox's cost per message, one extra round trip.
func BenchmarkInboxOverhead(b *testing.B) {
	s := newNATSStack(b, "")
	pool := s.drv.Pool()
	b.Run("handler-only", func(b *testing.B) {
		evs := benchEvents(b, b.N, 100)
		b.ResetTimer()
		for i := range b.N {
			tx, err := pool.Begin(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if err := pgxEffect(context.Background(), tx, evs[i]); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("inbox", func(b *testing.B) {
		ib, err := New[pgx.Tx](s.drv, fmt.Sprintf("overhead-%d", b.N), pgxEffect)
		if err != nil {
			b.Fatal(err)
		}
		evs := benchEvents(b, b.N, 100)
		b.ResetTimer()
		for i := range b.N {
			if err := ib.process(context.Background(), []*message{newMessage(delivery(evs[i], 1, &settled{}))}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if ib.Stats().Applied != int64(b.N) {
			b.Fatalf("applied %d of %d", ib.Stats().Applied, b.N)
		}
	})
}

// benchEvents returns n events spread round-robin over aggregates, each
// aggregate's sequence running 1, 2, 3….
func benchEvents(b testing.TB, n, aggregates int) []ferry.Event {
	evs := make([]ferry.Event, n)
	prefix := fmt.Sprintf("b%d-", time.Now().UnixNano())
	for i := range evs {
		a := i % aggregates
		evs[i] = event(b, "acme", fmt.Sprintf("%s%d", prefix, a), int64(i/aggregates+1), `{"qty":1}`)
	}
	return evs
}

// BenchmarkBatchCore is batch mode without a broker: one goroutine applies
// batches of 100 messages in one transaction: "bulk" is the default
// optimistic pass (on Postgres: one read and one write statement for the
// batch's claims and cursors, then the handlers), "savepoint-per-message"
// the fallback path (savepoint + claim + handler per message). It isolates
// the database cost per message from the broker's.
func BenchmarkBatchCore(b *testing.B) {
	s := newNATSStack(b, "")
	for _, always := range []bool{false, true} {
		name := "bulk"
		if always {
			name = "savepoint-per-message"
		}
		b.Run(name, func(b *testing.B) {
			ib, err := New[pgx.Tx](s.drv, fmt.Sprintf("batchcore-%s-%d", name, b.N), pgxEffect)
			if err != nil {
				b.Fatal(err)
			}
			ib.cfg.alwaysSavepoints = always
			evs := benchEvents(b, b.N, 1000)
			b.ResetTimer()
			for lo := 0; lo < b.N; lo += 100 {
				var msgs []*message
				for _, ev := range evs[lo:min(lo+100, b.N)] {
					msgs = append(msgs, newMessage(delivery(ev, 1, &settled{})))
				}
				if err := ib.process(context.Background(), msgs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if ib.Stats().Applied != int64(b.N) {
				b.Fatalf("applied %d of %d", ib.Stats().Applied, b.N)
			}
		})
	}
}
