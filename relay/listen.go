package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/logattr"
)

// listen holds a dedicated connection in LISTEN on the configured channel
// and wakes the worker on every notification. The connection is taken out
// of the pool (hijacked) so it never returns there in LISTEN state. When it
// is lost the relay reconnects with a capped backoff and wakes the worker
// once, since notifications sent meanwhile are gone; polling covers the gap.
func (r *Relay) listen(ctx context.Context) {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		connected, err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			delay = 100 * time.Millisecond // it worked for a while: start over
		}
		r.log.WarnContext(ctx, "LISTEN connection lost; reconnecting", "channel", r.cfg.listenChannel, logattr.Err(err), "retry_in", delay)
		if !sleep(ctx, delay) {
			return
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (r *Relay) listenOnce(ctx context.Context) (connected bool, err error) {
	pc, err := r.cfg.listenPool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire: %w", err)
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.listenChannel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	r.Notify() // anything committed before LISTEN took effect
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		r.Notify()
	}
}
