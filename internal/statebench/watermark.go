package statebench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// WatermarkDrain is a prototype of the relay #17 item 1 recommends, for
// measuring what keeping relay state out of the event row buys end to
// end: claim → publish → one watermark UPDATE per batch, on the same
// outbox, broker and pre-filled backlog as `ferry bench relay --backlog`.
//
// It is not a relay. It has no leases or fences, treats any failed
// publish as an error, and assumes no producer commits meanwhile (a
// pre-filled backlog has no late commits, so the watermark may pass every
// row it saw). What it keeps of the design: rows are claimed in id order
// per shard by an index range scan from the shard's watermark, the event
// rows are never updated, and the mark is one small HOT update per shard
// per batch, committed asynchronously like the relay's marks.
type WatermarkDrain struct {
	Pool      *pgxpool.Pool
	Tables    ferry.Tables
	Publisher broker.Publisher
	Workers   int // concurrent claim-publish-mark loops
	Batch     int // rows per loop cycle, over its shards
	Shards    int // default ferry.DefaultShardCount
}

// table is the prototype's watermark table: one row per shard.
func (d WatermarkDrain) table() string { return d.Tables.Name("relay_watermark") }

// Run publishes until want events were acknowledged and returns how many
// were (want or more) and the mark statements it ran.
func (d WatermarkDrain) Run(ctx context.Context, want int) (published int64, marks int64, err error) {
	if d.Shards == 0 {
		d.Shards = ferry.DefaultShardCount
	}
	if d.Workers < 1 || d.Batch < 1 {
		return 0, 0, fmt.Errorf("statebench: watermark drain: workers and batch must be >= 1 (got %d, %d)", d.Workers, d.Batch)
	}
	if _, err := d.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (shard integer PRIMARY KEY, sent_upto bigint NOT NULL)`, d.table())); err != nil {
		return 0, 0, fmt.Errorf("statebench: watermark table: %w", err)
	}
	if _, err := d.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s SELECT s, 0 FROM generate_series(0, $1 - 1) s ON CONFLICT DO NOTHING`, d.table()), d.Shards); err != nil {
		return 0, 0, fmt.Errorf("statebench: watermark rows: %w", err)
	}
	// The claim: per shard, rows above its watermark in id order, read from
	// outbox_claim_idx (shard, id) — rows stay 'pending' in this design, so
	// the partial index covers them all; the range starts at the watermark.
	claim := fmt.Sprintf(`SELECT o.id, o.event_id::text, o.tenant_id, o.aggregate_type, o.aggregate_id, o.aggregate_seq, o.event_type,
    o.schema_version, o.topic, o.shard, o.content_type, o.payload, o.occurred_at, o.traceparent, o.correlation_id, o.causation_id,
    o.principal, o.action, o.target
FROM unnest($1::int[], $2::bigint[]) AS s(shard, upto) CROSS JOIN LATERAL (
    SELECT * FROM %s o
    WHERE o.status = 'pending' AND (o.shard, o.id) > (s.shard, s.upto) AND (o.shard, o.id) < (s.shard + 1, 0)
    ORDER BY o.shard, o.id LIMIT $3) o`, d.Tables.Name("outbox"))
	mark := fmt.Sprintf(`WITH async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE %s w SET sent_upto = v.upto FROM unnest($1::int[], $2::bigint[]) AS v(shard, upto), async_commit
WHERE w.shard = v.shard AND w.sent_upto < v.upto`, d.table())

	var total, nmarks atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, d.Workers)
	for w := range d.Workers {
		var shards []int32
		for s := w; s < d.Shards; s += d.Workers {
			shards = append(shards, int32(s))
		}
		if len(shards) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			upto := make([]int64, len(shards))
			per := max(1, d.Batch/len(shards))
			for total.Load() < int64(want) && ctx.Err() == nil {
				events, top, err := d.claim(ctx, claim, shards, upto, per)
				if err != nil {
					errs <- err
					cancel()
					return
				}
				if len(events) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				for i, r := range d.Publisher.Publish(ctx, events) {
					if r.Err != nil {
						errs <- fmt.Errorf("statebench: publish event %s: %w", events[i].ID, r.Err)
						cancel()
						return
					}
				}
				// Sent only after every ack: the watermark of each shard moves
				// to the highest id of its rows in this batch.
				if _, err := d.Pool.Exec(ctx, mark, shards, top); err != nil {
					errs <- fmt.Errorf("statebench: mark: %w", err)
					cancel()
					return
				}
				nmarks.Add(1)
				copy(upto, top)
				total.Add(int64(len(events)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return total.Load(), nmarks.Load(), err
		}
	}
	return total.Load(), nmarks.Load(), nil
}

// claim reads up to per rows of each shard above its watermark and returns
// them with each shard's highest id read (its watermark when none).
func (d WatermarkDrain) claim(ctx context.Context, q string, shards []int32, upto []int64, per int) ([]ferry.Event, []int64, error) {
	rows, err := d.Pool.Query(ctx, q, shards, upto, per)
	if err != nil {
		return nil, nil, fmt.Errorf("statebench: claim: %w", err)
	}
	defer rows.Close()
	top := append([]int64(nil), upto...)
	index := make(map[int32]int, len(shards))
	for i, s := range shards {
		index[s] = i
	}
	var out []ferry.Event
	for rows.Next() {
		var e ferry.Event
		var id int64
		var eid string
		var ver, shard int32
		h := &e.Headers
		if err := rows.Scan(&id, &eid, &e.TenantID, &e.AggregateType, &e.AggregateID, &e.AggregateSeq, &e.EventType, &ver,
			&e.Topic, &shard, &e.ContentType, &e.Payload, &e.OccurredAt, &h.Traceparent, &h.CorrelationID, &h.CausationID,
			&h.Principal, &h.Action, &h.Target); err != nil {
			return nil, nil, fmt.Errorf("statebench: claim: scan: %w", err)
		}
		if e.ID, err = uuid.Parse(eid); err != nil {
			return nil, nil, fmt.Errorf("statebench: claim: row %d: %w", id, err)
		}
		e.SchemaVersion, e.Shard = int(ver), int(shard)
		if i := index[shard]; id > top[i] {
			top[i] = id
		}
		out = append(out, e)
	}
	return out, top, rows.Err()
}

// WatermarkCovers reports how many outbox rows lie at or below their
// shard's watermark (the rows the prototype marked sent).
func (d WatermarkDrain) WatermarkCovers(ctx context.Context) (int64, error) {
	var n int64
	err := d.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s o JOIN %s w ON w.shard = o.shard WHERE o.id <= w.sent_upto`,
		d.Tables.Name("outbox"), d.table())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("statebench: watermark coverage: %w", err)
	}
	return n, nil
}
