package inbox

import (
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// Sizing checks run once at start (New for the pool, Run for the broker):
// a configuration that cannot serve the workers does not fail, it stalls,
// so each mismatch is a warning naming both numbers and the fix.

// poolNeed is the connections Run uses at once: one per worker plus one for
// the heal sweep, the lag gauge and operator replays.
func (c *config) poolNeed() int { return c.workers + 1 }

// inFlightBound is the most messages one Run holds unacked: every worker's
// queue and batch, plus what the consumer buffers ahead of the handler
// (buffered: natsjs's pull batch; 0 for RabbitMQ and Kafka).
func (ib *Inbox[TTx]) inFlightBound(buffered int) int {
	return ib.cfg.workers*(ib.cfg.queue+ib.cfg.batch) + buffered
}

// checkPool warns when drv's pool cap is below what the workers need.
// SQLite is skipped: it has one writer whatever the pool.
func (ib *Inbox[TTx]) checkPool(drv driver.Driver[TTx]) {
	if drv.Dialect() == driver.SQLite {
		return
	}
	maxConns, ok := driver.MaxConns(drv)
	need := ib.cfg.poolNeed()
	if !ok || maxConns >= need {
		return
	}
	ib.log.Warn(fmt.Sprintf("inbox: database pool max conns %d < inbox workers %d + 1: workers wait for connections; set pool_max_conns>=%d (pgxpool) or SetMaxOpenConns(%d) (database/sql), or WithWorkers(%d)",
		maxConns, ib.cfg.workers, need, need, max(1, maxConns-1)),
		"pool_max_conns", maxConns, "workers", ib.cfg.workers, "need", need)
}

// inFlightLimiter is implemented by consumers whose broker caps the
// delivered-but-unacked messages (natsjs: max ack pending, ack wait, pull
// batch; rabbitmq: prefetch). redeliverAfter is how long the broker keeps
// an unacked message of a dead consumer before redelivering it (natsjs's
// ack wait; a live natsjs consumer keeps its messages alive, so it bounds
// no transaction); 0 means the broker returns it as soon as the connection
// dies (RabbitMQ).
type inFlightLimiter interface {
	InFlightLimits() (maxUnacked, buffered int, redeliverAfter time.Duration)
}

// checkConsumer warns when the consumer's broker limits and the inbox's
// in-flight bound do not fit together.
func (ib *Inbox[TTx]) checkConsumer(c any) {
	l, ok := c.(inFlightLimiter)
	if !ok {
		return
	}
	maxUnacked, buffered, redeliverAfter := l.InFlightLimits()
	bound := ib.inFlightBound(buffered)
	w, q, b := ib.cfg.workers, ib.cfg.queue, ib.cfg.batch
	if redeliverAfter > 0 {
		// A killed consumer's unacked messages (up to bound) keep their
		// max-ack-pending slots until the ack wait expires; a restarted
		// consumer gets only what is left.
		if maxUnacked > 0 && maxUnacked < 2*bound {
			ib.log.Warn(fmt.Sprintf("inbox: consumer max ack pending %d < 2 × inbox in-flight bound %d (workers %d × (queue %d + batch %d) + pull batch %d): after a crash the dead consumer's up to %d unacked messages hold their slots for ack wait %s and a restarted consumer gets %d; set max ack pending >= %d (natsjs.WithMaxAckPending) or lower WithQueue/WithWorkers",
				maxUnacked, bound, w, q, b, buffered, min(bound, maxUnacked), redeliverAfter, max(0, maxUnacked-bound), 2*bound),
				"max_ack_pending", maxUnacked, "in_flight_bound", bound)
		}
		// The ack wait is not checked against the drain timeout or the
		// transaction time: natsjs keeps a live consumer's unsettled
		// messages alive (InProgress), so the ack wait only says how long a
		// dead consumer's messages wait.
		return
	}
	// RabbitMQ: the prefetch window is the in-flight bound; below
	// workers × batch some workers idle or batches never fill.
	if maxUnacked > 0 && maxUnacked < w*b {
		ib.log.Warn(fmt.Sprintf("inbox: consumer prefetch %d < inbox workers %d × batch %d: at most %d messages are in flight, so workers idle and batches stay short; set prefetch >= %d (rabbitmq.WithPrefetch) or lower WithWorkers/WithBatch",
			maxUnacked, w, b, maxUnacked, w*b),
			"prefetch", maxUnacked, "workers", w, "batch", b)
	}
}
