package prove

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// refRelay is prove's reference relay: the design's polling relay reduced
// to what the crash matrix exercises — shard leases with a fence token,
// head-of-line order per aggregate, mark sent only after the broker's ack,
// backoff with full jitter and a ping probe during outages. It runs until
// ctx ends or a planned fault kills it.
type refRelay struct {
	env  *env
	id   string
	pub  broker.Publisher
	ttl  time.Duration
	held map[int]int64 // shard -> fence

	// markBeforeAck is the deliberately broken build: rows are marked sent
	// before the publish, so a crash in between loses them.
	markBeforeAck bool
	// pauseOnce, when set, makes the relay stall after its first fetch for
	// longer than the lease (a GC pause, a frozen VM) and then carry on.
	pauseOnce *atomic.Bool
}

type outboxRow struct {
	id    int64
	shard int
	ev    ferry.Event
}

func (r *refRelay) run(ctx context.Context) error {
	backoff := 20 * time.Millisecond
	for ctx.Err() == nil {
		worked := false
		for shard := 0; shard < proveShards; shard++ {
			fence, ok, err := r.lease(ctx, shard)
			if err != nil {
				r.env.rec.err(err)
				continue
			}
			if !ok {
				continue
			}
			n, err := r.shard(ctx, shard, fence)
			if err == errCrash {
				return err
			}
			if err != nil {
				r.env.rec.err(err)
				// Outage: probe with Ping instead of burning publishes.
				sleepJitter(ctx, backoff)
				backoff = min(backoff*2, time.Second)
				for ctx.Err() == nil {
					pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					perr := r.pub.Ping(pctx)
					cancel()
					if perr == nil {
						break
					}
					sleepJitter(ctx, backoff)
					backoff = min(backoff*2, time.Second)
				}
				continue
			}
			backoff = 20 * time.Millisecond
			worked = worked || n > 0
		}
		if !worked {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// sleepJitter sleeps a random duration in [0, d) (full jitter).
func sleepJitter(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(rand.Int64N(int64(d) + 1))):
	}
}

// lease renews or takes shard's lease and returns its fence token.
func (r *refRelay) lease(ctx context.Context, shard int) (int64, bool, error) {
	now := time.Now()
	exp := now.Add(r.ttl).UnixNano()
	exec := r.env.db.drv.Executor()
	if f, ok := r.held[shard]; ok {
		n, err := exec.Exec(ctx, `UPDATE prove_lease SET expires_at = $1 WHERE shard = $2 AND owner = $3 AND fence = $4 AND expires_at >= $5`,
			exp, shard, r.id, f, now.UnixNano())
		if err != nil {
			return 0, false, fmt.Errorf("relay: renew lease: %w", err)
		}
		if n == 1 {
			return f, true, nil
		}
		delete(r.held, shard)
	}
	n, err := exec.Exec(ctx, `UPDATE prove_lease SET owner = $1, fence = fence + 1, expires_at = $2 WHERE shard = $3 AND (expires_at < $4 OR owner = '')`,
		r.id, exp, shard, now.UnixNano())
	if err != nil {
		return 0, false, fmt.Errorf("relay: take lease: %w", err)
	}
	if n == 0 {
		return 0, false, nil
	}
	rows, err := exec.Query(ctx, `SELECT fence FROM prove_lease WHERE shard = $1 AND owner = $2`, shard, r.id)
	if err != nil {
		return 0, false, fmt.Errorf("relay: read fence: %w", err)
	}
	defer rows.Close()
	var f int64
	if !rows.Next() {
		return 0, false, nil
	}
	if err := rows.Scan(&f); err != nil {
		return 0, false, fmt.Errorf("relay: read fence: %w", err)
	}
	r.held[shard] = f
	return f, true, nil
}

const outboxColumns = `id, shard, event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
 topic, content_type, payload, occurred_at, traceparent, correlation_id, causation_id, principal, action, target`

// shard publishes one batch of shard's pending rows.
func (r *refRelay) shard(ctx context.Context, shard int, fence int64) (int, error) {
	rows, err := r.fetch(ctx, shard)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	if r.pauseOnce != nil && r.pauseOnce.CompareAndSwap(true, false) {
		r.env.faults.Add(1)
		r.env.log.DebugContext(ctx, "prove: relay paused past its lease", slog.String("relay", r.id), slog.Int("shard", shard))
		// Stall until another relay has taken the lease over (bounded), not
		// a fixed time: a fixed stall either ends before the takeover or
		// after the run has settled, and then there is no late mark to fence.
		deadline := time.Now().Add(5 * r.ttl)
		for time.Now().Before(deadline) && !r.leaseTakenOver(ctx, shard, fence) {
			select {
			case <-ctx.Done():
				return 0, nil
			case <-time.After(r.ttl / 10):
			}
		}
	}
	events := make([]ferry.Event, len(rows))
	for i := range rows {
		events[i] = rows[i].ev
	}
	if r.markBeforeAck {
		if err := r.mark(ctx, shard, fence, rows, nil); err != nil {
			return 0, err
		}
		for _, row := range rows {
			if r.env.fire(faultRelayCrash, row.ev.ID.String()) {
				return 0, errCrash // marked sent, never published
			}
		}
	}
	results := r.pub.Publish(ctx, events)
	for _, row := range rows {
		if r.env.fire(faultRelayCrash, row.ev.ID.String()) {
			r.env.log.DebugContext(ctx, "prove: relay crashed after publish, before mark", slog.String("relay", r.id), slog.String("event_id", row.ev.ID.String()))
			return 0, errCrash // published, not marked: the next owner republishes
		}
	}
	if r.markBeforeAck {
		return len(rows), nil
	}
	// Mark only the acked prefix of each aggregate: a failed row holds the
	// rest of its aggregate (head-of-line), other aggregates go on.
	var ok []outboxRow
	var receipts []string
	blocked := map[string]bool{}
	var firstErr error
	for i, res := range results {
		k := ferry.AggregateKey(rows[i].ev.TenantID, rows[i].ev.AggregateType, rows[i].ev.AggregateID)
		if res.Err != nil || blocked[k] {
			blocked[k] = true
			if firstErr == nil && res.Err != nil {
				firstErr = res.Err
			}
			continue
		}
		ok = append(ok, rows[i])
		receipts = append(receipts, res.Receipt.String())
	}
	if len(ok) > 0 {
		if err := r.mark(ctx, shard, fence, ok, receipts); err != nil {
			return 0, err
		}
	}
	if firstErr != nil {
		return len(ok), fmt.Errorf("relay: publish: %w", firstErr)
	}
	return len(ok), nil
}

// leaseTakenOver reports whether shard's lease has moved past fence (another
// relay took it after ours expired).
func (r *refRelay) leaseTakenOver(ctx context.Context, shard int, fence int64) bool {
	q, err := r.env.db.drv.Executor().Query(ctx, `SELECT fence FROM prove_lease WHERE shard = $1`, shard)
	if err != nil {
		return false
	}
	defer q.Close()
	var f int64
	return q.Next() && q.Scan(&f) == nil && f > fence
}

func (r *refRelay) fetch(ctx context.Context, shard int) ([]outboxRow, error) {
	q, err := r.env.db.drv.Executor().Query(ctx, `SELECT `+outboxColumns+` FROM ferry_outbox WHERE shard = $1 AND status = 'pending' ORDER BY id LIMIT 200`, shard)
	if err != nil {
		return nil, fmt.Errorf("relay: fetch: %w", err)
	}
	defer q.Close()
	var out []outboxRow
	for q.Next() {
		var row outboxRow
		var id string
		e := &row.ev
		h := &e.Headers
		if err := q.Scan(&row.id, &row.shard, &id, &e.TenantID, &e.AggregateType, &e.AggregateID, &e.AggregateSeq, &e.EventType, &e.SchemaVersion,
			&e.Topic, &e.ContentType, &e.Payload, &e.OccurredAt, &h.Traceparent, &h.CorrelationID, &h.CausationID, &h.Principal, &h.Action, &h.Target); err != nil {
			return nil, fmt.Errorf("relay: scan: %w", err)
		}
		if e.ID, err = parseUUID(id); err != nil {
			return nil, fmt.Errorf("relay: event id: %w", err)
		}
		e.Shard = row.shard
		out = append(out, row)
	}
	return out, q.Err()
}

// mark sets rows sent, in one transaction that first re-checks the fence:
// a relay whose lease was taken over has its late marks rejected.
func (r *refRelay) mark(ctx context.Context, shard int, fence int64, rows []outboxRow, receipts []string) error {
	tx, err := r.env.db.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("relay: mark: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	n, err := fenceCheck(ctx, tx, shard, r.id, fence)
	if err != nil {
		return fmt.Errorf("relay: mark fence: %w", err)
	}
	if n == 0 {
		r.env.rec.fencedMarks.Add(1)
		delete(r.held, shard)
		return nil // fenced out: the new owner republishes and marks
	}
	now := time.Now().UTC()
	for i, row := range rows {
		rc := ""
		if receipts != nil {
			rc = receipts[i]
		}
		if _, err := tx.Exec(ctx, `UPDATE ferry_outbox SET status = 'sent', published_at = $1, broker_receipt = $2, attempts = attempts + 1 WHERE id = $3`,
			now, rc, row.id); err != nil {
			return fmt.Errorf("relay: mark: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: mark commit: %w", err)
	}
	for _, row := range rows {
		r.env.metrics.published.WithLabelValues(row.ev.EventType).Inc()
	}
	return nil
}
