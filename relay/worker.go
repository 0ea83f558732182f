package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/sanitize"
	"github.com/ferryhq/ferry/otelferry"
)

// claimed is one outbox row taken into a batch.
type claimed struct {
	id       int64
	fence    int64
	attempts int
	ev       ferry.Event
	// createdAt is the partition key of a partitioned outbox's row (nil
	// otherwise); the marks match on it.
	createdAt *time.Time
	// WithSentWatermark: retry is a row of the claim's retry arm (marked
	// sent explicitly when acked); snap is the claim's snapshot. waits is
	// a retry row above its shard's watermark at the claim: an earlier row
	// of its aggregate may be acked but not yet passed by the watermark,
	// so it is not marked sent when acked but passed with them by the
	// advance (which makes it 'pending' again in the same statement).
	retry bool
	waits bool
	// snap is the claim's horizon in the watermark design: the claim
	// statement's own transaction id (watermark.go, "Late commits").
	snap string
	// after (WithShardPipeline) is the batch in flight at the claim that
	// holds the aggregate's earlier rows: this row is published only once
	// that batch got them all acked, and marked only once it marked them
	// all sent (pipeline.go).
	after *landing
}

type aggKey struct{ tenant, typ, id string }

type tenantShard struct {
	shard  int
	tenant string
}

func keyOf(e *ferry.Event) aggKey { return aggKey{e.TenantID, e.AggregateType, e.AggregateID} }

// work is worker w's claim → publish → mark loop. Worker 0 is the one
// woken by Notify, LISTEN and the poll timer; it claims from every idle
// shard at once, so a quiet relay spends one query per wake-up. When a
// claim fills a shard's share (a backlog), it wakes the other workers and
// every worker claims from a rotating subset of idle shards (about
// owned/workers each), so one batch's database round trips overlap
// another's broker round trips. A shard is never in two batches at once
// (takeIdle). It returns nil when ctx is done, or an error wrapping
// ErrFaultInjected when a fault hook fired.
func (r *Relay) work(ctx context.Context, w int) error {
	poll := time.NewTimer(0)
	defer poll.Stop()
	if w > 0 {
		poll.Stop() // helpers run only when woken
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake[w]:
		case <-poll.C:
		}
		subset := w > 0
		for {
			limit := 0
			if subset {
				shards, _ := r.ownedSnapshot()
				limit = max(1, (len(shards)+r.cfg.workers-1)/r.cfg.workers)
			}
			more, err := r.cycle(ctx, limit)
			if err != nil {
				if errors.Is(err, ErrFaultInjected) {
					return err
				}
				if ctx.Err() != nil {
					return nil
				}
				r.log.WarnContext(ctx, "relay cycle failed", logattr.Err(err))
				break
			}
			if !more || ctx.Err() != nil {
				break
			}
			if !subset && r.cfg.workers > 1 {
				subset = true
				r.wakeHelpers()
			}
		}
		if r.probeOwner.CompareAndSwap(false, true) {
			// One worker probes while the breaker is open; the others
			// skip their cycles until it closes.
			ok := true
			if r.breakerOpen() {
				ok = r.probe(ctx)
			}
			r.probeOwner.Store(false)
			if !ok {
				return nil
			}
		}
		if w == 0 {
			if !poll.Stop() {
				select {
				case <-poll.C:
				default:
				}
			}
			poll.Reset(r.cfg.poll)
		}
	}
}

func (r *Relay) breakerOpen() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.breaker == BreakerOpen
}

// probe pings the broker at an exponentially growing, capped interval
// until it answers (breaker closes) or ctx is done (returns false). Rows
// are untouched meanwhile: an outage burns no attempts.
func (r *Relay) probe(ctx context.Context) bool {
	d := r.cfg.probeBase
	for {
		if !sleep(ctx, d) {
			return false
		}
		pctx, cancel := context.WithTimeout(ctx, max(d, time.Second))
		err := r.ping(pctx)
		cancel()
		if err == nil {
			r.setBreaker(BreakerClosed)
			r.Notify() // resume now; helpers join if there is a backlog
			return true
		}
		r.log.DebugContext(ctx, "broker probe failed", slog.String(logattr.ErrKey, sanitize.Error(err)), "next_probe", min(2*d, r.cfg.probeMax))
		d = min(2*d, r.cfg.probeMax)
	}
}

func (r *Relay) ping(ctx context.Context) error {
	r.pingCalls.Add(1)
	r.m.brokerCalls.WithLabelValues("ping").Inc()
	return r.pub.Ping(ctx)
}

// cycle runs one claim-publish-mark round. more reports that a shard
// filled its share of the batch, i.e. there is probably more to do now.
func (r *Relay) cycle(ctx context.Context, limit int) (more bool, err error) {
	shards, fences, excl := r.takeIdle(limit)
	defer r.doneShards(shards)
	if len(shards) == 0 || r.breakerOpen() {
		r.flightStart(shards, excl, nil, nil) // WithShardPipeline: the claim is over
		return false, nil
	}
	t0 := time.Now()
	batch, more, deferred, err := r.claim(ctx, shards, fences, r.claimPer(len(shards)), excl)
	r.m.phase.WithLabelValues("claim").Observe(time.Since(t0).Seconds())
	// WithShardPipeline: the batch is in flight until its marks are
	// written; the shards may be claimed again meanwhile (pipeline.go).
	l := r.flightStart(shards, excl, batch, deferred)
	defer r.flightEnd(l)
	if more && r.flight != nil && len(batch) > 0 {
		// Claim the shards' next rows while this batch is in flight.
		r.wakeAll()
	}
	if err == nil && len(batch) == 0 && r.q.watermark {
		// Acked rows waiting for a producer transaction to end.
		err = r.advance(ctx, shards, nil, nil)
	}
	if err != nil || len(batch) == 0 {
		return false, err
	}
	// WithPublishRate: wait for tokens (leases still renew meanwhile) and
	// publish only the rows whose lease survived the wait.
	if batch = r.awaitPublish(ctx, batch); len(batch) == 0 {
		return more && ctx.Err() == nil, nil
	}
	// WithShardPipeline: publish after the batches holding earlier rows
	// of these aggregates, and not the aggregates they did not get acked
	// (pipeline.go). Waited for before the publish deadline starts: the
	// wait is bounded by those batches' own deadlines, and counted in
	// this one it would time out this batch's publishes under a slow
	// broker and charge their rows attempts.
	var hold map[aggKey]bool
	if l != nil {
		hold = r.awaitPublished(ctx, batch)
	}
	// The batch finishes even if ctx is cancelled meanwhile (graceful
	// shutdown): publish and mark under their own deadline.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.publishTimeout)
	defer cancel()
	return more, r.publishAndMark(bctx, batch, l, hold)
}

// claim reads up to per due rows of every owned shard. Rows are selected
// by status, never by "id above the last one seen": identity values commit
// out of order, and such a cursor skips the late ones forever.
//
// excl (WithShardPipeline, else nil) is what is in flight of the shards:
// those rows are not read, and rows of aggregates in flight are left out;
// deferred lists the shards where that happened.
func (r *Relay) claim(ctx context.Context, shards []int, fences map[int]int64, per int, excl *exclusion) (_ []claimed, _ bool, deferred map[int]bool, _ error) {
	exec := r.db.Executor()
	// Sized for a full claim: growing a slice of claimed (each holds an
	// event) as rows arrive was a tenth of the relay's CPU in a drain.
	out := make([]claimed, 0, per*len(shards))
	more := false
	// One row's scan targets, built once: c is reset before each row and
	// copied into out after it (a slice of 20-odd pointers and a claimed
	// escaping per row otherwise).
	var c claimed
	var eid string
	var seq, ver, shard, attempts, wm int64
	var createdAt time.Time
	e := &c.ev
	h := &e.Headers
	dest := []any{&c.id, &eid, &e.TenantID, &e.AggregateType, &e.AggregateID, &seq, &e.EventType, &ver,
		&e.Topic, &shard, &e.ContentType, &e.Payload, &e.OccurredAt, &h.Traceparent, &h.CorrelationID, &h.CausationID,
		&h.Principal, &h.Action, &h.Target, &attempts}
	if r.q.partitioned {
		dest = append(dest, &createdAt)
	}
	if r.q.watermark {
		dest = append(dest, &c.retry, &wm, &c.snap)
	}
	// WithMaxBatchBytes: each shard takes rows in id order while they fit
	// its share of the budget (always its first row). cut holds a shard's
	// first row left out: rows of the shard above it are dropped too, so
	// what is claimed stays a prefix of the shard in id order, and so of
	// each of its aggregates.
	budget := r.shareBytes(len(shards))
	shardBytes := map[int]int{}
	var cut map[int]int64
	total, rowsRead := 0, 0
	scan := func(rows driver.Rows) error {
		defer rows.Close()
		counts := map[int]int{}
		var tenantCounts map[tenantShard]int // WithTenantShare
		for rows.Next() {
			c = claimed{}
			if err := rows.Scan(dest...); err != nil {
				return fmt.Errorf("relay: claim: scan: %w", err)
			}
			if r.q.partitioned {
				at := createdAt
				c.createdAt = &at
			}
			id, err := uuid.Parse(eid)
			if err != nil {
				return fmt.Errorf("relay: claim: row %d has a bad event_id: %w", c.id, err)
			}
			e.ID, e.AggregateSeq, e.SchemaVersion, e.Shard = id, seq, int(ver), int(shard)
			c.waits = c.retry && c.id > wm && !r.cfg.noRetryWait
			e.OccurredAt = e.OccurredAt.UTC()
			c.attempts = int(attempts)
			c.fence = fences[e.Shard]
			if a := excl.inFlight(keyOf(e)); a != nil {
				if a.retry {
					// The aggregate's row in flight failed before: this
					// one waits for that batch's marks, which wake the
					// relay (pipeline.go). Not counted towards more:
					// claiming again before then would read it again.
					if deferred == nil {
						deferred = map[int]bool{}
					}
					deferred[e.Shard] = true
					continue
				}
				if !r.cfg.noMarkOrder {
					c.after = a.l
				}
			}
			counts[e.Shard]++
			if counts[e.Shard] >= per {
				more = true
			}
			if counts[e.Shard] > per {
				// A pipelined claim reads past per (sql.go): the shard's
				// first per rows are a prefix of it, the rest wait.
				continue
			}
			rowsRead++
			total += len(e.Payload)
			if b := shardBytes[e.Shard]; b > 0 && b+len(e.Payload) > budget {
				if first, ok := cut[e.Shard]; !ok || c.id < first {
					if cut == nil {
						cut = map[int]int64{}
					}
					cut[e.Shard] = c.id
				}
				more = true
				continue
			}
			shardBytes[e.Shard] += len(e.Payload)
			if share := r.cfg.tenantShare; share > 0 && !more {
				// A tenant that filled its share has more rows waiting,
				// even when the shard's share is not full.
				tk := tenantShard{e.Shard, e.TenantID}
				if tenantCounts == nil {
					tenantCounts = map[tenantShard]int{}
				}
				if tenantCounts[tk]++; tenantCounts[tk] >= share {
					more = true
				}
			}
			out = append(out, c)
		}
		return rows.Err()
	}
	if r.q.watermark {
		rows, err := exec.Query(ctx, r.q.claim, r.q.shardsParam(shards), per, r.wmAcked(shards, fences))
		if err != nil {
			return nil, false, nil, fmt.Errorf("relay: claim: %w", err)
		}
		if err := scan(rows); err != nil {
			return nil, false, nil, err
		}
	} else if r.q.dialect == driver.Postgres {
		args := []any{r.q.shardsParam(shards), per}
		if r.q.pipeline {
			ids, perShard := excl.params(shards)
			args = append(args, ids, perShard)
		}
		rows, err := exec.Query(ctx, r.q.claim, args...)
		if err != nil {
			return nil, false, nil, fmt.Errorf("relay: claim: %w", err)
		}
		if err := scan(rows); err != nil {
			return nil, false, nil, err
		}
	} else {
		for _, s := range shards {
			rows, err := exec.Query(ctx, r.q.claim, s, per)
			if err != nil {
				return nil, false, nil, fmt.Errorf("relay: claim shard %d: %w", s, err)
			}
			if err := scan(rows); err != nil {
				return nil, false, nil, err
			}
		}
	}
	if rowsRead > 0 {
		r.rowBytes.Store(int64(max(1, total/rowsRead)))
	}
	return orderBatch(cutShards(out, cut)), more, deferred, nil
}

// claimPer is the claim's LIMIT per shard for a claim of n shards: the
// batch size split over them, and with large payloads about what the
// shard's share of the byte budget will take at the last claim's mean
// payload (claim cuts exactly), not rows it would read only to drop.
func (r *Relay) claimPer(n int) int {
	per := max(1, (r.cfg.claimSize()+n-1)/max(1, n))
	if avg := r.rowBytes.Load(); avg > 0 {
		per = min(per, int(int64(r.shareBytes(n))/avg)+1)
	}
	return per
}

// shareBytes is one shard's share of WithMaxBatchBytes in a claim of n
// shards.
func (r *Relay) shareBytes(n int) int {
	return max(1, r.cfg.batchBytes/max(1, n))
}

// cutShards drops the rows of each shard in cut at or above its first
// row left out. The claim returns a shard's rows in id order, so those
// are the ones after it; the filter keeps the prefix even if they came
// in another order.
func cutShards(b []claimed, cut map[int]int64) []claimed {
	if len(cut) == 0 {
		return b
	}
	out := b[:0]
	for _, c := range b {
		if first, ok := cut[c.ev.Shard]; ok && c.id >= first {
			continue
		}
		out = append(out, c)
	}
	return out
}

// orderBatch sorts a batch by id and keeps, per aggregate, only a run of
// consecutive sequence numbers. Defence in depth: the claim query already
// guarantees it. It also stops an aggregate after a row that failed before
// (attempts > 0): a row likely to fail again is published alone, so its
// later events are not pipelined past it (which would put them on the
// broker ahead of it).
func orderBatch(b []claimed) []claimed {
	sort.Slice(b, func(i, j int) bool { return b[i].id < b[j].id })
	type run struct {
		last int64 // the aggregate's last sequence kept
		stop bool  // nothing more of the aggregate in this batch
	}
	runs := make(map[aggKey]run, len(b))
	out := b[:0]
	for _, c := range b {
		k := keyOf(&c.ev)
		r, seen := runs[k]
		if r.stop {
			continue
		}
		if seen && c.ev.AggregateSeq != r.last+1 {
			runs[k] = run{stop: true}
			continue
		}
		runs[k] = run{last: c.ev.AggregateSeq, stop: c.attempts > 0}
		out = append(out, c)
	}
	return out
}

// publishAndMark publishes a batch, waits for every result and writes the
// outcome in at most two statements, each fenced (three with
// WithSentWatermark: the advance). l is the batch's place in the shard
// pipeline (nil without it), where the aggregates it marked all sent are
// recorded for the batches after it; hold are the aggregates it must not
// publish (awaitPublished).
func (r *Relay) publishAndMark(ctx context.Context, batch []claimed, l *landing, hold map[aggKey]bool) (err error) {
	var notAcked map[aggKey]bool // WithShardPipeline: aggregates with a row not acked
	if l != nil {
		// The rows held stay pending, untouched, and count as not acked
		// for the batches after this one.
		defer l.publishDone(nil, true) // if returning before the publish
		if len(hold) > 0 {
			kept := batch[:0]
			for _, c := range batch {
				if !hold[keyOf(&c.ev)] {
					kept = append(kept, c)
				}
			}
			batch = kept
			if len(batch) == 0 {
				l.publishDone(hold, false)
				return nil
			}
			notAcked = hold
		}
	}
	events := make([]ferry.Event, len(batch))
	for i := range batch {
		events[i] = batch[i].ev
	}
	if r.cfg.advanceFirst && r.q.watermark { // the negative control: "sent" before the ack
		all := make([]bool, len(batch))
		for i := range all {
			all[i] = !batch[i].retry
		}
		if err := r.advance(ctx, shardsOf(batch), batch, all); err != nil {
			return err
		}
	}
	if f := r.cfg.faults.BeforePublish; f != nil {
		if err := f(ctx, events); err != nil {
			r.crashed.Store(true)
			return fmt.Errorf("%w: before publish: %w", ErrFaultInjected, err)
		}
	}
	r.publishCalls.Add(1)
	r.m.brokerCalls.WithLabelValues("publish").Inc()
	dest := batchDestination(events)
	pctx, span := r.cfg.tracer.Start(ctx, otelferry.SpanName(otelferry.OperationSend, dest), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(otelferry.SendAttributes(r.pub.Name(), dest, len(events))...))
	if span.IsRecording() { // links cost a parse per event: only when someone records
		for i := range events {
			if tp := events[i].Headers.Traceparent; tp != "" {
				span.AddLink(trace.LinkFromContext(otelferry.ContextFromTraceparent(context.Background(), tp),
					attribute.String("ferry.event_id", events[i].ID.String())))
			}
		}
	}
	t0 := time.Now()
	results := r.pub.Publish(pctx, events)
	span.End()
	r.m.phase.WithLabelValues("publish").Observe(time.Since(t0).Seconds())
	if len(results) != len(events) {
		err := broker.NewError(broker.ClassIndeterminate,
			fmt.Errorf("publisher %s returned %d results for %d events", r.pub.Name(), len(results), len(events)))
		results = make([]broker.Result, len(events))
		for i := range results {
			results[i].Err = err
		}
	}
	acked := time.Now()
	if l != nil {
		for i := range results {
			if results[i].Err != nil {
				if notAcked == nil {
					notAcked = map[aggKey]bool{}
				}
				notAcked[keyOf(&batch[i].ev)] = true
			}
		}
		l.publishDone(notAcked, false)
	}
	if f := r.cfg.faults.AfterPublishBeforeMark; f != nil {
		if err := f(ctx, events, results); err != nil {
			r.crashed.Store(true)
			return fmt.Errorf("%w: after publish, before mark: %w", ErrFaultInjected, err)
		}
	}
	if r.crashed.Load() {
		// Another worker "crashed": a crashed process marks nothing more.
		return nil
	}
	// WithSentWatermark: pending-arm rows the broker acked are not marked;
	// once the failures are written, the advance passes them (and holds
	// the rest as retry). Skipped after an error or a fenced mark: the
	// rows above the watermark are then published again.
	var wmAcked []bool
	fenced := false
	if r.q.watermark {
		wmAcked = make([]bool, len(batch))
		defer func() {
			if err == nil && !fenced && !r.crashed.Load() {
				err = r.advance(ctx, shardsOf(batch), batch, wmAcked)
			}
		}()
	}

	// Walk in batch order. After an aggregate's first failure its later
	// rows are left untouched: never marked sent ahead of the failed one
	// (G3), and not charged an attempt they did not cause. They were
	// possibly delivered already; they are published again after the
	// failed row, and the broker's dedup or the consumer's cursor absorbs
	// the copy.
	var sent []sentRow
	var sentIdx []int
	var failed []failedRow
	var failedIdx []int
	transient := 0
	// Destinations the broker accepted an event for: a transient failure
	// on one that took events lately is the row's own; on one that took
	// none, the destination's (the outage check below).
	accepted := map[string]bool{}
	for i := range results {
		if results[i].Err == nil {
			accepted[batch[i].ev.Topic] = true
		}
	}
	r.accepted.record(accepted, acked, acked.Add(-r.cfg.probeMax))
	blocked := map[aggKey]bool{}
	if r.flight != nil {
		// WithShardPipeline: rows whose aggregate's earlier rows were in
		// another batch are marked only if that batch marked them all
		// sent; otherwise they are left untouched like the later rows of
		// a failed aggregate below (pipeline.go).
		for k := range awaitEarlier(ctx, batch) {
			blocked[k] = true
		}
	}
	var held map[string]*heldDest        // destination → rows held this batch (missing)
	var unavailable map[string]*heldDest // destination → rows held this batch (unavailable)
	now := time.Now()
	for i := range batch {
		c := &batch[i]
		k := keyOf(&c.ev)
		if blocked[k] && !r.cfg.noAggregateStop {
			continue
		}
		res := results[i]
		if res.Err == nil && wmAcked != nil && (!c.retry || c.waits) {
			wmAcked[i] = true
			r.m.latency.Observe(acked.Sub(c.ev.OccurredAt).Seconds())
			if res.Receipt.Duplicate {
				r.duplicates.Add(1)
				r.m.duplicates.Inc()
			}
		}
		if res.Err == nil {
			if wmAcked == nil || c.retry && !c.waits {
				sent = append(sent, sentRow{ID: c.id, Fence: c.fence, Receipt: res.Receipt.String(), CreatedAt: c.createdAt})
				sentIdx = append(sentIdx, i)
			}
			if was, d := r.missing.ok(c.ev.Topic, now); was {
				r.log.InfoContext(pctx, "destination exists again; held events are being published", "destination", c.ev.Topic, "missing_for", d.Round(time.Millisecond))
			}
			if was, d := r.unavailable.ok(c.ev.Topic, now); was {
				r.log.InfoContext(pctx, "destination accepts events again; held events are being published", "destination", c.ev.Topic, "unavailable_for", d.Round(time.Millisecond))
			}
			continue
		}
		blocked[k] = true
		class := broker.ClassOf(res.Err)
		fr := failedRow{ID: c.id, Fence: c.fence, Err: class.String() + ": " + sanitize.Error(res.Err), Charge: 1, CreatedAt: c.createdAt}
		switch {
		case errors.Is(res.Err, broker.ErrDestinationMissing):
			// A configuration fault, not a poison event: the topic,
			// subject or routing key does not exist (yet). Hold the row
			// (no attempt charged, so never dead), retry it with the
			// destination's capped backoff, and report the destination.
			if held == nil {
				held = map[string]*heldDest{}
			}
			h := held[c.ev.Topic]
			if h == nil {
				h = &heldDest{delay: r.missing.failed(c.ev.Topic, now, r.cfg.backoffBase, r.cfg.probeMax), err: fr.Err}
				held[c.ev.Topic] = h
			}
			h.rows++
			fr.Charge, fr.Delay = 0, h.delay.Seconds()
		case class == broker.ClassPermanent:
			fr.Dead = true
		case c.attempts+1 >= r.cfg.maxAttempts:
			// Its last attempt, but failed like the others: counted for
			// the outage check below, so a broker that is down does not
			// dead-letter the rows that happen to be at their last try.
			fr.Dead = true
			transient++
		default:
			fr.Delay = r.backoff(c.attempts + 1).Seconds()
			transient++
		}
		failed = append(failed, fr)
		failedIdx = append(failedIdx, i)
	}
	if held != nil || len(sent) > 0 {
		r.refreshMissing()
	}

	if len(sent) > 0 {
		n, err := r.mark(ctx, r.q.markSent, sent, "sent")
		if err != nil {
			return err
		}
		r.published.Add(uint64(n))
		r.m.published.Add(float64(n))
		if l != nil && n == int64(len(sent)) {
			l.sentAggs = make(map[aggKey]bool, len(sentIdx))
			for _, i := range sentIdx {
				if k := keyOf(&batch[i].ev); !blocked[k] {
					l.sentAggs[k] = true
				}
			}
		}
		if n == int64(len(sent)) {
			for _, i := range sentIdx {
				r.m.latency.Observe(acked.Sub(batch[i].ev.OccurredAt).Seconds())
				if results[i].Receipt.Duplicate {
					r.duplicates.Add(1)
					r.m.duplicates.Inc()
				}
			}
		} else {
			fenced = true
			r.fencedWrites(int64(len(sent))-n, "sent")
		}
		r.m.batches.Inc()
	}
	if len(failed) == 0 {
		return nil
	}
	if transient > 0 && !r.cfg.noBreaker {
		// Is this the broker being down rather than these rows failing?
		// Then open the breaker and charge no attempts: an outage must not
		// move rows towards dead, nor hammer the broker with retries.
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		perr := r.ping(pctx)
		cancel()
		if perr != nil {
			r.setBreaker(BreakerOpen)
			r.log.WarnContext(pctx, "broker unreachable; breaker open, attempts not charged",
				"failed_rows", transient, slog.String(logattr.ErrKey, sanitize.Error(perr)))
			kept := failed[:0]
			keptIdx := failedIdx[:0]
			for j, fr := range failed {
				if fr.Dead && broker.ClassOf(results[failedIdx[j]].Err) == broker.ClassPermanent {
					kept = append(kept, fr)
					keptIdx = append(keptIdx, failedIdx[j])
				}
			}
			failed, failedIdx = kept, keptIdx
			if len(failed) == 0 {
				return nil
			}
		} else {
			unavailable = r.holdUnavailable(failed, failedIdx, batch, results, t0.Add(-r.cfg.probeMax), now)
		}
	}
	n, err := r.mark(ctx, r.q.markFailed, failed, "failed")
	if err != nil {
		return err
	}
	if n < int64(len(failed)) {
		fenced = true
		r.fencedWrites(int64(len(failed))-n, "failed")
		return nil
	}
	for dest, h := range unavailable {
		r.log.WarnContext(pctx, "destination unavailable: every publish to it failed and none succeeded while the broker answers; events held, no attempt charged",
			"alert", "destination_unavailable", "destination", dest, "held_rows", h.rows,
			"retry_in", h.delay.Round(time.Millisecond), slog.String(logattr.ErrKey, h.err))
	}
	for dest, h := range held {
		r.log.WarnContext(pctx, "destination missing on the broker: events held, no attempt charged, never dead; create it (or fix the routing)",
			"alert", "destination_missing", "destination", dest, "held_rows", h.rows,
			"retry_in", h.delay.Round(time.Millisecond), slog.String(logattr.ErrKey, h.err))
	}
	for j, fr := range failed {
		c := &batch[failedIdx[j]]
		if fr.Charge == 0 {
			r.retries.Add(1)
			r.m.retries.Inc()
			continue
		}
		attrs := []any{"event_id", c.ev.ID.String(), "aggregate", ferry.AggregateKey(c.ev.TenantID, c.ev.AggregateType, c.ev.AggregateID),
			"aggregate_seq", c.ev.AggregateSeq, "attempts", c.attempts + 1, "err", fr.Err}
		if fr.Dead {
			r.dead.Add(1)
			r.m.deadTotal.Inc()
			r.log.ErrorContext(pctx, "event dead-lettered", append(attrs, "dead_policy", string(r.cfg.deadPolicy))...)
		} else {
			r.retries.Add(1)
			r.m.retries.Inc()
			r.log.WarnContext(pctx, "publish failed; retrying later", append(attrs, "retry_in", time.Duration(fr.Delay*float64(time.Second)).Round(time.Millisecond))...)
		}
	}
	return nil
}

// holdUnavailable is the outage check's second level, run when the broker
// answered the ping: a transient failure on a destination the broker
// accepted nothing for since lately (one probe cap before this batch's
// publish) is the destination failing, not the row — a JetStream stream
// without a quorum (its node cut off from the others still answers the
// ping), a Kafka partition without a leader, a RabbitMQ queue whose node
// is down. Such rows are held like rows of a missing destination: no
// attempt charged (so never dead from an outage, however long), retried
// with the destination's capped backoff rather than the row's. A row that
// keeps failing while others reach its destination is still charged and
// goes dead at max attempts. When a row is the only traffic of its
// destination the two cannot be told apart and it is held: a held row is
// never lost and shows in the backlog age and the gauge; a dead one would
// hold its aggregate (DeadHold) until an operator replays it.
func (r *Relay) holdUnavailable(failed []failedRow, failedIdx []int, batch []claimed, results []broker.Result, lately, now time.Time) map[string]*heldDest {
	var out map[string]*heldDest
	for j := range failed {
		fr := &failed[j]
		i := failedIdx[j]
		topic := batch[i].ev.Topic
		if fr.Charge == 0 || broker.ClassOf(results[i].Err) == broker.ClassPermanent || r.accepted.since(topic, lately) {
			continue
		}
		if out == nil {
			out = map[string]*heldDest{}
		}
		h := out[topic]
		if h == nil {
			h = &heldDest{delay: r.unavailable.failed(topic, now, r.cfg.backoffBase, r.cfg.probeMax), err: fr.Err}
			out[topic] = h
		}
		h.rows++
		fr.Charge, fr.Dead, fr.Delay = 0, false, h.delay.Seconds()
	}
	if out != nil {
		r.refreshMissing()
	}
	return out
}

// heldDest is one missing (or unavailable) destination's share of a batch.
type heldDest struct {
	rows  int
	delay time.Duration
	err   string // the first row's error, sanitized
}

func (r *Relay) fencedWrites(n int64, kind string) {
	r.fenced.Add(uint64(n))
	r.m.fenced.Add(float64(n))
	r.log.Warn("lease lost: row updates rejected by the fence; the new owner republishes them", "rows", n, "kind", kind)
}

// mark runs one fenced update over rows and returns how many rows it
// changed; fewer than len(rows) means the lease was lost meanwhile.
func (r *Relay) mark(ctx context.Context, sql string, rows any, kind string) (int64, error) {
	p, err := jsonParam(rows)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	n, err := r.db.Executor().Exec(ctx, sql, r.cfg.instance, p)
	r.m.phase.WithLabelValues("mark_" + kind).Observe(time.Since(t0).Seconds())
	if err != nil {
		return 0, fmt.Errorf("relay: mark %s: %w", kind, err)
	}
	if r.cfg.afterMark != nil {
		r.cfg.afterMark(kind)
	}
	return n, nil
}

// backoff returns the delay before attempt+1: full jitter, uniform in
// [0, min(max, base·2^(attempt-1))].
func (r *Relay) backoff(attempt int) time.Duration {
	return backoff.Full(r.cfg.backoffBase, r.cfg.backoffMax, attempt)
}

// batchDestination is the topic every event of a batch goes to, or "" when
// they go to several (the span is then named by its operation alone).
func batchDestination(events []ferry.Event) string {
	if len(events) == 0 {
		return ""
	}
	d := events[0].Topic
	for i := range events[1:] {
		if events[i+1].Topic != d {
			return ""
		}
	}
	return d
}
