package prove

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// The database crash (db-crash, control-dual-write-db-crash): the
// scenario's database lives on a throwaway Postgres server prove starts
// itself (dbcrash_pg.go), which is SIGKILLed — postmaster and every
// backend at once — while the producers commit, the relay marks and the
// consumer applies, then restarted on the same data directory and port.
// Crash recovery replays the WAL; every component reconnects on its own.

// dbCrashes is how many times a db-crash scenario crashes the server:
// the first a plain SIGKILL of the process group, the second a freeze
// (SIGSTOP of the server's processes: every statement in flight hangs)
// for dbCrashFreeze and until some producer hangs in COMMIT (at most 1 s
// more; else a 100 ms thaw and a new freeze, five tries), then the SIGKILL, so that a commit whose answer is lost (an
// unknown outcome) is there whenever producers are still at work, not a
// matter of luck.
const dbCrashes = 2

// dbCrashHold is how long the server stays dead before the restart;
// dbCrashFreeze how long the second crash's freeze lasts.
const (
	dbCrashHold   = 500 * time.Millisecond
	dbCrashFreeze = 300 * time.Millisecond
)

// needsTempServer: the db-crash scenarios run with a Postgres or MySQL
// stack (the scenario's schema or database then lives on prove's own
// server of that kind — a MySQL stack gets a throwaway mariadbd — never on
// the given one, which is not crashed) and the server binaries.
func needsTempServer(st *stack, _ *config) string {
	switch {
	case st.pgURL != "":
		return pgServerMissing()
	case st.myURL != "":
		return mariadbServerMissing()
	}
	return "needs Postgres or MySQL (--database-url postgres://… or mysql://…): SQLite is a library inside prove's own process, there is no server to crash"
}

// crashServerKind is the kind of throwaway server the stack's database
// calls for.
func (st *stack) crashServerKind() string {
	if st.myURL != "" {
		return serverMariaDB
	}
	return serverPostgres
}

// onServer is the stack with its database server (or, for a RabbitMQ
// node, its broker) replaced by the throwaway server p.
func (st *stack) onServer(p *tempServer) *stack {
	c := *st
	switch p.kind {
	case serverRabbitMQ:
		c.amqpURL = p.URL()
	case serverMariaDB:
		c.pgURL, c.myURL = "", p.URL()
	default:
		c.pgURL, c.myURL = p.URL(), ""
	}
	return &c
}

// runDBCrash crashes and restarts pg dbCrashes times, each once a further
// share of the workload's transactions has an outcome (or the budget is
// spent), and returns the report's note.
func runDBCrash(ctx context.Context, e *env, pg *tempServer) (string, error) {
	total := len(e.plan.txs)
	var recov []string
	inCommit := int32(0)
	for i := 0; i < dbCrashes; i++ {
		want := total * (i + 1) / (dbCrashes + 1)
		deadline := time.Now().Add(e.cfg.duration)
		for e.plan.outcomes.count() < want && time.Now().Before(deadline) && ctx.Err() == nil {
			sleepCtx(ctx, 5*time.Millisecond)
		}
		// The ack-before-commit control: crash while its consumer holds
		// a message acked and not committed. Under load the consumer can
		// lag the producers by seconds; a crash while it holds none shows
		// nothing (CI once saw lost 0, consumer lag p50 4.7 s).
		for e.sc.ackEarly && e.earlyAcked.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			sleepCtx(ctx, time.Millisecond)
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if i%2 == 1 {
			// Frozen, every producer hangs at its next statement; wait
			// (bounded) until one hangs in COMMIT, so the kill takes a
			// COMMIT's answer with it. If none does (all were between
			// transactions or retrying), thaw briefly and freeze again.
			for try := 0; try < 5; try++ {
				pg.freeze()
				sleepCtx(ctx, dbCrashFreeze)
				for w := 0; w < 50 && e.plan.committing.Load() == 0 && ctx.Err() == nil; w++ {
					sleepCtx(ctx, 20*time.Millisecond)
				}
				if inCommit = e.plan.committing.Load(); inCommit > 0 {
					break
				}
				pg.thaw()
				sleepCtx(ctx, 100*time.Millisecond)
			}
			sleepCtx(ctx, 20*time.Millisecond) // the COMMIT written to the socket
		}
		e.plan.serverDown.Store(true)
		if err := pg.crash(); err != nil {
			return "", err
		}
		e.faults.Add(1)
		e.prog.update("database crashed (%d/%d), restarting", i+1, dbCrashes)
		sleepCtx(ctx, dbCrashHold)
		t0 := time.Now()
		err := pg.start(context.WithoutCancel(ctx))
		e.plan.serverDown.Store(false)
		if err != nil {
			return "", err
		}
		recov = append(recov, time.Since(t0).Round(10*time.Millisecond).String())
	}
	return fmt.Sprintf("throwaway %s (port %d) SIGKILLed %d times mid-run (the second after a freeze of at least %s, with %d producers in COMMIT), down %s each, restarted on the same data dir and port; crash recovery to first connection took %s",
		pg.kind, pg.port, dbCrashes, dbCrashFreeze, inCommit, dbCrashHold, strings.Join(recov, ", ")), nil
}

// dbCrashBit checks both crashes fired and one took a COMMIT's answer
// with it: otherwise the unknown case was not exercised.
func dbCrashBit(e *env, f *Figures, _ *truth) []string {
	var v []string
	if f.FaultsInjected != dbCrashes {
		v = append(v, fmt.Sprintf("%d database crashes, want %d", f.FaultsInjected, dbCrashes))
	}
	if f.Unknown == 0 {
		v = append(v, "no commit outcome was lost in the crashes (unknown 0): the unknown case was not exercised")
	}
	return v
}

// produceNaiveInTx is the dual write of control-dual-write-db-crash: each
// transaction writes its business rows, publishes its events straight to
// the broker, does some more work (the scenario's throttle) and commits.
// A crash between the publish and the commit announces a change that
// never happened; and a producer told that its commit failed has already
// published. Outcomes are recorded like the outbox producer's; nothing
// is retried after BEGIN.
func produceNaiveInTx(ctx context.Context, e *env) error {
	return produceNaiveWith(ctx, e, naiveInTx)
}

func naiveInTx(ctx context.Context, e *env, pub broker.Publisher, mu *sync.Mutex, seq map[string]int64, ptx *plannedTx) error {
	events := make([]ferry.Event, len(ptx.events))
	mu.Lock()
	for i, pe := range ptx.events {
		ev := pe.event()
		ev.AggregateSeq = seq[ev.TenantID+"/"+ev.AggregateID] + int64(i) + 1 // the producer's own count
		ev.Topic = e.tr.topicTemplate().Render(&ev)
		ev.ContentType = ferry.DefaultContentType
		ev.OccurredAt = time.Now().UTC()
		events[i] = ev
	}
	mu.Unlock()
	start := time.Now()
	for {
		out, err := runTxOnceCounting(ctx, e.db, ptx, &e.plan.committing, func(_ *sql.Tx, _ []ferry.Event) error {
			for _, r := range pub.Publish(ctx, events) {
				if r.Err != nil {
					return fmt.Errorf("prove: naive publish: %w", r.Err)
				}
			}
			sleepCtx(ctx, e.sc.throttle) // the rest of the transaction's work
			return nil
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if out == "" && err != nil { // BEGIN failed: nothing published yet
			if e.plan.serverDown.Load() {
				start = time.Now() // the budget does not count the time the server is held down
			}
			if time.Since(start) > producerRetryBudget {
				return fmt.Errorf("prove: naive producer tx %d: %w", ptx.id, err)
			}
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		e.plan.outcomes.set(ptx.id, out)
		if out == outcomeCommitted {
			mu.Lock()
			for _, ev := range events {
				seq[ev.TenantID+"/"+ev.AggregateID] = ev.AggregateSeq
			}
			mu.Unlock()
		}
		return nil
	}
}
