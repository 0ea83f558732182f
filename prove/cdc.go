package prove

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/relay/cdc"
)

// cdcRestarts is how many times the CDC relay is stopped mid-stream.
const cdcRestarts = 3

// startCDCRelay runs package relay/cdc (Postgres logical replication)
// and stops it cdcRestarts times at seeded moments, leaving it down for a
// while each time so transactions commit while nobody reads the slot; the
// last instance runs until ctx ends. With startFromCurrentWAL (the
// negative control) each restart skips what committed while it was down.
// restartsDone is closed after the last restart.
func startCDCRelay(ctx context.Context, wg *sync.WaitGroup, e *env, startFromCurrentWAL bool, restartsDone chan<- struct{}) {
	s1, s2 := seedFor(e.cfg.seed, e.sc.name+"/cdc")
	rng := rand.New(rand.NewPCG(s1, s2))
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			if restartsDone != nil {
				close(restartsDone)
			}
		}()
		for i := 0; ctx.Err() == nil; i++ {
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- e.runCDC(rctx, startFromCurrentWAL) }()
			if i < cdcRestarts {
				select {
				case <-ctx.Done():
				case <-time.After(200*time.Millisecond + time.Duration(rng.Int64N(int64(300*time.Millisecond)))):
					e.faults.Add(1)
				case err := <-done:
					e.rec.err(err)
				}
			} else {
				if restartsDone != nil {
					close(restartsDone)
					restartsDone = nil
				}
				<-ctx.Done()
			}
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				e.rec.err(err)
			}
			sleepCtx(ctx, 150*time.Millisecond) // down: commits pile up in the WAL
		}
	}()
}

func (e *env) runCDC(ctx context.Context, startFromCurrentWAL bool) error {
	pub, err := e.newPublisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := cdc.New(e.db.adminURL, pub, cdc.WithTables(ferry.Tables{Schema: e.db.schema}),
		cdc.WithSlotName(e.db.schema), cdc.WithPublicationName(e.db.schema),
		cdc.WithStandbyTimeout(200*time.Millisecond), cdc.WithAcquireInterval(100*time.Millisecond),
		cdc.WithBackoff(20*time.Millisecond, 500*time.Millisecond), cdc.WithLogger(e.log),
		cdc.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"prove_instance": randHex(3)}, e.reg)),
		cdc.WithFaults(cdc.Faults{StartFromCurrentWAL: startFromCurrentWAL}))
	if err != nil {
		return fmt.Errorf("prove: cdc relay: %w", err)
	}
	return r.Run(ctx)
}

// dropCDC removes the scenario's replication slot and publication: a
// forgotten slot pins WAL on the server for ever.
func (e *env) dropCDC(ctx context.Context) {
	ex := e.db.drv.Executor()
	for i := 0; i < 50; i++ {
		if _, err := ex.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, e.db.schema); err == nil {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond) // the walsender may still hold it
	}
	_, _ = ex.Exec(ctx, fmt.Sprintf(`DROP PUBLICATION IF EXISTS %q`, e.db.schema))
}
