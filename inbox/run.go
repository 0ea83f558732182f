package inbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/partition"
)

// Run consumes from c until ctx is cancelled or c fails, applying each
// message through the inbox and acking only after its transaction
// committed. Messages of one aggregate go to one worker (hash of tenant,
// aggregate type and id), so they are applied serially in broker order;
// different aggregates run in parallel on the configured workers. A message
// whose (tenant, event id) is still queued or in process on another worker
// (an event id reused on another aggregate) waits until that worker has
// finished it, so of two copies the one delivered first is decided first:
// it is applied and the later one parks as a collision. In-flight
// work is bounded by workers × (queue + batch): when it is full Run stops
// pulling from c.
//
// On cancellation Run stops pulling, lets each worker finish the
// transaction it is in (bounded by the drain timeout, after which the
// transaction is rolled back), leaves queued messages unacked for
// redelivery, and returns nil. It returns c's error if c failed, or a
// *FaultError if a fault hook fired. Run does not close c.
func (ib *Inbox[TTx]) Run(ctx context.Context, c broker.Consumer) error {
	if c == nil {
		return errors.New("inbox: Run needs a consumer")
	}
	ib.running.Store(&c)
	defer ib.running.Store(nil)
	ib.checkConsumer(c)

	// intake stops Consume; work is what in-flight transactions run under,
	// cancelled only after the drain timeout (or at once on a fault).
	intake, stopIntake := context.WithCancelCause(ctx)
	defer stopIntake(nil)
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()

	var faultOnce sync.Once
	var fault error
	onFault := func(err error) {
		faultOnce.Do(func() {
			fault = err
			ib.log.ErrorContext(ctx, "fault injected: stopping without ack", logattr.Err(err))
			stopWork()
			stopIntake(err)
		})
	}

	queues := make([]chan *message, ib.cfg.workers)
	gate := newIDGate()
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan *message, ib.cfg.queue)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ib.worker(intake, work, queues[i], gate, onFault)
		}()
	}
	if keeper, ok := ib.partitionKeeper(ctx); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keeper.Maintain(intake, ib.cfg.partitionEvery)
		}()
	}
	if ib.cfg.healInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ib.healLoop(intake, work)
		}()
	}

	consumeErr := c.Consume(intake, func(_ context.Context, d *broker.Delivery) {
		if d == nil {
			return
		}
		m := ib.admit(d)
		w := ib.route(m)
		if !gate.enter(intake, m, w) {
			return
		}
		select {
		case queues[w] <- m:
		case <-intake.Done():
		}
	})
	stopIntake(nil)
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	timer := time.NewTimer(ib.cfg.drainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		ib.log.WarnContext(ctx, "drain timeout: rolling back in-flight transactions", "timeout", ib.cfg.drainTimeout)
		stopWork()
		<-drained
	}
	if fault != nil {
		return fault
	}
	if consumeErr != nil && !errors.Is(consumeErr, context.Canceled) {
		return consumeErr
	}
	return nil
}

// route picks the worker of m's aggregate; undecodable messages, which
// have no aggregate, go to worker 0.
func (ib *Inbox[TTx]) route(m *message) int {
	if m.invalid != nil {
		return 0
	}
	// The shard hash: one aggregate, one worker.
	return ferry.ShardFor(m.ev.TenantID, m.ev.AggregateType, m.ev.AggregateID, ib.cfg.workers)
}

// worker applies the messages of its aggregates, one transaction per
// message or per batch.
func (ib *Inbox[TTx]) worker(intake, work context.Context, q <-chan *message, gate *idGate, onFault func(error)) {
	batch := make([]*message, 0, ib.cfg.batch)
	for {
		if intake.Err() != nil {
			return
		}
		select {
		case <-intake.Done():
			return
		case m := <-q:
			batch = append(batch[:0], m)
			batch = ib.fill(intake, q, batch)
			err := ib.process(work, batch)
			gate.leave(batch)
			if err != nil {
				onFault(err)
				return
			}
		}
	}
}

// fill tops a batch up from q: what is queued now, then waiting up to the
// linger time for more.
func (ib *Inbox[TTx]) fill(intake context.Context, q <-chan *message, batch []*message) []*message {
	if ib.cfg.batch <= 1 {
		return batch
	}
	var linger <-chan time.Time
	if ib.cfg.batchLinger > 0 {
		t := time.NewTimer(ib.cfg.batchLinger)
		defer t.Stop()
		linger = t.C
	}
	for len(batch) < ib.cfg.batch {
		select {
		case m := <-q:
			batch = append(batch, m)
			continue
		default:
		}
		if linger == nil {
			return batch
		}
		select {
		case m := <-q:
			batch = append(batch, m)
		case <-linger:
			return batch
		case <-intake.Done():
			return batch
		}
	}
	return batch
}

// partitionKeeper returns the keeper of a partitioned inbox after its
// first Ensure; ok is false for a plain inbox (one catalog lookup) or
// when the lookup fails (logged: claims still work, into the default
// partition if no range covers them).
func (ib *Inbox[TTx]) partitionKeeper(ctx context.Context) (partition.Keeper, bool) {
	exec := ib.drv.Executor()
	parted, err := partition.IsPartitioned(ctx, exec, ib.cfg.tables, partition.Inbox)
	if err != nil {
		ib.log.WarnContext(ctx, "inbox partition check failed; no partitions created ahead by this process", logattr.Err(err))
		return partition.Keeper{}, false
	}
	if !parted {
		return partition.Keeper{}, false
	}
	k := partition.Keeper{Exec: exec, Tables: ib.cfg.tables, Table: partition.Inbox, Log: ib.log}
	if err := k.Start(ctx); err != nil {
		// Start fails only for an outbox without a current partition; the
		// inbox's default partition takes any claim, so Run goes on.
		ib.log.WarnContext(ctx, "inbox partitions not created ahead", logattr.Err(err))
	}
	return k, true
}

func (ib *Inbox[TTx]) healLoop(intake, work context.Context) {
	t := time.NewTicker(ib.cfg.healInterval)
	defer t.Stop()
	for {
		select {
		case <-intake.Done():
			return
		case <-t.C:
			if n, err := ib.HealGaps(work); err != nil {
				ib.log.WarnContext(intake, "heal sweep failed", logattr.Err(err))
			} else if n > 0 {
				ib.log.InfoContext(intake, "heal sweep applied parked gap successors", "resolved", n)
			}
		}
	}
}
