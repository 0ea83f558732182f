package prove

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// produceNaive is the dual write the outbox exists to replace: commit the
// business change, then publish straight to the broker. A crash between
// the two loses the event; publishing before a commit that then rolls back
// announces a change that never happened.
func produceNaive(ctx context.Context, e *env) error {
	return produceNaiveWith(ctx, e, naiveTx)
}

// produceNaiveWith runs the plan's transactions through one naive
// producer shape (publish after commit, or inside the transaction), all
// producers sharing one publisher and the per-aggregate count.
func produceNaiveWith(ctx context.Context, e *env,
	tx func(context.Context, *env, broker.Publisher, *sync.Mutex, map[string]int64, *plannedTx) error) error {
	pub, err := e.newPublisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	var mu sync.Mutex
	seq := map[string]int64{}
	return eachProducer(e.plan, e.cfg.producers, func(ptx *plannedTx) error {
		return tx(ctx, e, pub, &mu, seq, ptx)
	})
}

func naiveTx(ctx context.Context, e *env, pub broker.Publisher, mu *sync.Mutex, seq map[string]int64, ptx *plannedTx) error {
	events := make([]ferry.Event, len(ptx.events))
	mu.Lock()
	for i, pe := range ptx.events {
		ev := pe.event()
		k := ev.TenantID + "/" + ev.AggregateID
		ev.AggregateSeq = seq[k] + int64(i) + 1 // the producer's own count
		ev.Topic = e.tr.topicTemplate().Render(&ev)
		ev.ContentType = ferry.DefaultContentType
		ev.OccurredAt = time.Now().UTC()
		events[i] = ev
	}
	mu.Unlock()
	publish := func() error {
		for _, r := range pub.Publish(ctx, events) {
			if r.Err != nil {
				return fmt.Errorf("prove: naive publish: %w", r.Err)
			}
		}
		return nil
	}
	_, err := runTxOnce(ctx, e.db, ptx, func(_ *sql.Tx, _ []ferry.Event) error {
		if ptx.rollback {
			return publish() // announced inside a transaction that rolls back
		}
		return nil
	})
	if err != nil || ptx.rollback {
		return err
	}
	mu.Lock()
	for _, ev := range events {
		seq[ev.TenantID+"/"+ev.AggregateID] = ev.AggregateSeq
	}
	mu.Unlock()
	for _, pe := range ptx.events {
		if e.fire(faultProducer, pe.id) {
			return nil // crashed after commit, before publish
		}
	}
	return publish()
}
