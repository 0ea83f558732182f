package relay

import "context"

// The shard pipeline (WithShardPipeline > 1): more than one batch of a
// shard in flight at once.
//
// A shard's rows stay 'pending' until their batch is marked, so a second
// claim of the shard would see the first batch's rows again. The rules
// that keep G2 and G3 (each has a negative control in pipeline_test.go):
//
//   - One claim of a shard at a time (flights.claiming): a claim reads
//     the shard's rows and registers them as in flight before the next
//     claim of the shard may start, so no row is in two batches.
//   - A pipelined claim leaves out the rows in flight (by id, in the
//     claim's SQL, after a LIMIT raised by their number), so what it takes
//     of an aggregate continues where the batches in flight stop: the
//     aggregate's next rows in sequence order.
//   - Publishes follow the batches' order per aggregate: a batch holding
//     rows of an aggregate that was in flight at its claim publishes only
//     after the earlier batch's publish returned (its acks or failures),
//     and leaves out, unpublished and untouched, the aggregates whose rows
//     that batch did not get acked. Concurrent publishes of two batches
//     would otherwise race on the connection and store a later event
//     first with no fault at all.
//   - Marks follow the batches' order per aggregate: a row of an
//     aggregate that was in flight at its claim is marked only after the
//     batch holding the aggregate's earlier rows has written its marks,
//     and only if that batch marked all of them sent. Otherwise it is left
//     pending, untouched and uncharged — as a later row of a failed
//     aggregate within one batch is — and published again after the
//     earlier row. A later event is never marked sent while an earlier one
//     is unacked.
//   - An aggregate whose rows in flight include a retry (attempts > 0) is
//     left out of a pipelined claim: a row likely to fail again is
//     published alone for its aggregate, as within one batch.
//
// A batch leaves the flight only after its marks, so a row whose mark
// failed is pending and due again and is claimed before its aggregate's
// later rows. The pipeline adds no case to G3's "holds when": a later
// event reaches the broker before an earlier one only within one batch,
// as without it. Memory stays bounded by workers × WithMaxBatchBytes (a
// batch is one worker's).

// flights is what a pipelined relay has in flight, per shard (under
// Relay.mu).
type flights struct {
	claiming map[int]bool               // a claim of the shard is running
	ids      map[int]map[int64]struct{} // rows in flight
	// aggs: per aggregate, the batches in flight holding its rows, in
	// claim order. Not only the last: a later batch may land first (it
	// held the aggregate back), and the earlier one still decides.
	aggs map[int]map[aggKey][]*aggInBatch
	// deferred: a claim left rows out for an aggregate in flight; when
	// a batch of the shard lands, the relay is woken to claim them.
	deferred map[int]bool
}

// aggInBatch is an aggregate's rows in one batch in flight.
type aggInBatch struct {
	l     *landing
	retry bool // one of them failed before (attempts > 0)
}

func newFlights() *flights {
	return &flights{claiming: map[int]bool{}, ids: map[int]map[int64]struct{}{},
		aggs: map[int]map[aggKey][]*aggInBatch{}, deferred: map[int]bool{}}
}

// exclusion is what one pipelined claim must know of the flight.
type exclusion struct {
	ids     []int64
	aggs    map[aggKey]*aggInBatch
	inShard map[int]int32 // rows in flight per shard
}

// inFlight returns the last batch in flight holding k's earlier rows, if
// any (retry set if any batch in flight holds a retry of k).
func (x *exclusion) inFlight(k aggKey) *aggInBatch {
	if x == nil || len(x.aggs) == 0 {
		return nil
	}
	return x.aggs[k]
}

// params are the claim's parameters $3 (the rows in flight) and $4 (how
// many per shard, in the order of shards); never nil.
func (x *exclusion) params(shards []int) (ids []int64, perShard []int32) {
	ids, perShard = []int64{}, make([]int32, len(shards))
	if x == nil {
		return ids, perShard
	}
	if x.ids != nil {
		ids = x.ids
	}
	for i, s := range shards {
		perShard[i] = x.inShard[s]
	}
	return ids, perShard
}

// begin marks shards as being claimed and returns what their claim must
// know: everything of theirs in flight.
func (f *flights) begin(shards []int) *exclusion {
	x := &exclusion{inShard: map[int]int32{}}
	for _, s := range shards {
		f.claiming[s] = true
		for id := range f.ids[s] {
			x.ids = append(x.ids, id)
		}
		x.inShard[s] = int32(len(f.ids[s]))
		for k, in := range f.aggs[s] {
			if x.aggs == nil {
				x.aggs = map[aggKey]*aggInBatch{}
			}
			last := *in[len(in)-1]
			for _, a := range in {
				last.retry = last.retry || a.retry
			}
			x.aggs[k] = &last
		}
	}
	return x
}

// landing is one batch in flight.
type landing struct {
	shards []int
	rows   []landingRow
	// sentAggs are the aggregates whose rows in the batch were all marked
	// sent; written before done is closed, read only after.
	sentAggs map[aggKey]bool
	done     chan struct{}
	// notAcked are the aggregates with a row of the batch that the broker
	// did not ack or that was not published (all of them when notAckedAll);
	// written before published is closed, read only after. pubClosed is
	// the batch's own worker's (no lock).
	notAcked    map[aggKey]bool
	notAckedAll bool
	published   chan struct{}
	pubClosed   bool
}

// publishDone records the batch's publish outcome and releases the
// batches waiting to publish after it. With all, no row counts as acked
// (the batch gave up before or without publishing). Called by the batch's
// own worker; later calls are no-ops.
func (l *landing) publishDone(notAcked map[aggKey]bool, all bool) {
	if l == nil || l.pubClosed {
		return
	}
	l.notAcked, l.notAckedAll, l.pubClosed = notAcked, all, true
	close(l.published)
}

type landingRow struct {
	shard int
	id    int64
	agg   aggKey
	retry bool
}

// flightStart ends the claim of shards (which knew excl): batch is in
// flight from now on, and deferred lists the shards whose claim left rows
// out for an aggregate in flight. A no-op without the pipeline.
func (r *Relay) flightStart(shards []int, excl *exclusion, batch []claimed, deferred map[int]bool) *landing {
	if r.flight == nil {
		return nil
	}
	if len(batch) > 0 && excl != nil && len(excl.ids) > 0 {
		r.pipelined.Add(1)
		r.m.pipelined.Inc()
	}
	l := &landing{shards: shards, rows: make([]landingRow, len(batch)), done: make(chan struct{}), published: make(chan struct{})}
	for i := range batch {
		c := &batch[i]
		l.rows[i] = landingRow{shard: c.ev.Shard, id: c.id, agg: keyOf(&c.ev), retry: c.attempts > 0}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.flight
	for _, s := range shards {
		delete(f.claiming, s)
	}
	for s := range deferred {
		f.deferred[s] = true
	}
	for _, row := range l.rows {
		ids := f.ids[row.shard]
		if ids == nil {
			ids = map[int64]struct{}{}
			f.ids[row.shard] = ids
		}
		ids[row.id] = struct{}{}
		aggs := f.aggs[row.shard]
		if aggs == nil {
			aggs = map[aggKey][]*aggInBatch{}
			f.aggs[row.shard] = aggs
		}
		if in := aggs[row.agg]; len(in) > 0 && in[len(in)-1].l == l {
			in[len(in)-1].retry = in[len(in)-1].retry || row.retry
		} else {
			aggs[row.agg] = append(in, &aggInBatch{l: l, retry: row.retry})
		}
	}
	return l
}

// flightEnd takes a batch out of the flight once its marks are written
// (or it was given up), releases the batches waiting on it, and wakes the
// relay if a claim left rows out meanwhile.
func (r *Relay) flightEnd(l *landing) {
	if l == nil {
		return
	}
	r.mu.Lock()
	f := r.flight
	wake := false
	for _, row := range l.rows {
		delete(f.ids[row.shard], row.id)
		if len(f.ids[row.shard]) == 0 {
			delete(f.ids, row.shard)
		}
		in := f.aggs[row.shard][row.agg]
		for i, a := range in {
			if a.l == l {
				in = append(in[:i:i], in[i+1:]...)
				break
			}
		}
		if len(in) == 0 {
			delete(f.aggs[row.shard], row.agg)
		} else {
			f.aggs[row.shard][row.agg] = in
		}
		if len(f.aggs[row.shard]) == 0 {
			delete(f.aggs, row.shard)
		}
	}
	for _, s := range l.shards {
		if f.deferred[s] {
			delete(f.deferred, s)
			wake = true
		}
	}
	r.mu.Unlock()
	l.publishDone(nil, true)
	close(l.done)
	if wake {
		r.Notify()
	}
}

// awaitPublished waits until every batch that held earlier rows of this
// batch's aggregates has published, and returns the aggregates whose
// earlier rows were not all acked (or whose batch did not publish before
// ctx ended): their rows in this batch must not be published.
func (r *Relay) awaitPublished(ctx context.Context, batch []claimed) map[aggKey]bool {
	if r.cfg.noPublishOrder {
		return nil
	}
	return awaitAfter(ctx, batch, func(l *landing) <-chan struct{} { return l.published },
		func(l *landing, k aggKey) bool { return !l.notAckedAll && !l.notAcked[k] })
}

// awaitEarlier waits until every batch that held earlier rows of this
// batch's aggregates has written its marks, and returns the aggregates
// whose earlier rows were not all marked sent (or whose batch did not land
// before ctx ended): their rows in this batch must not be marked.
func awaitEarlier(ctx context.Context, batch []claimed) map[aggKey]bool {
	return awaitAfter(ctx, batch, func(l *landing) <-chan struct{} { return l.done },
		func(l *landing, k aggKey) bool { return l.sentAggs[k] })
}

// awaitAfter waits, for each row whose aggregate had earlier rows in a
// batch in flight at its claim, until that batch is ready, and returns
// the aggregates for which it is not ok (or ctx ended first).
func awaitAfter(ctx context.Context, batch []claimed, ready func(*landing) <-chan struct{}, ok func(*landing, aggKey) bool) map[aggKey]bool {
	var hold map[aggKey]bool
	for i := range batch {
		c := &batch[i]
		if c.after == nil {
			continue
		}
		k := keyOf(&c.ev)
		select {
		case <-ready(c.after):
			if ok(c.after, k) {
				continue
			}
		case <-ctx.Done():
		}
		if hold == nil {
			hold = map[aggKey]bool{}
		}
		hold[k] = true
	}
	return hold
}
