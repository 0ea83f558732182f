package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// postgresInsertSQL is one statement that allocates every aggregate's
// sequence and inserts every event of a call: one round trip.
//
// The upsert on aggregate_seq takes the row lock that serialises writers of
// one aggregate until commit. Aggregates are upserted in key order so two
// transactions touching the same aggregates lock them in the same order and
// cannot deadlock. Each event's sequence is last_seq - n + its position
// within the aggregate in this call.
func postgresInsertSQL(t ferry.Tables, notify string) string {
	notifyJoin := ""
	if notify != "" {
		// Evaluated once per statement; delivered only at commit, and
		// identical notifications in one transaction are folded into one.
		notifyJoin = fmt.Sprintf("\n    CROSS JOIN (SELECT pg_notify('%s', '')) AS n", notify)
	}
	return fmt.Sprintf(`WITH input AS (
    SELECT * FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[],
        $8::text[], $9::int[], $10::text[], $11::bytea[], $12::timestamptz[],
        $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[]
    ) WITH ORDINALITY AS i(event_id, tenant_id, aggregate_type, aggregate_id, ord, event_type, schema_version,
        topic, shard, content_type, payload, occurred_at,
        traceparent, correlation_id, causation_id, principal, action, target, pos)
), counts AS (
    SELECT tenant_id, aggregate_type, aggregate_id, count(*) AS n
    FROM input GROUP BY tenant_id, aggregate_type, aggregate_id
), seq AS (
    INSERT INTO %[1]s AS s (tenant_id, aggregate_type, aggregate_id, last_seq)
    SELECT tenant_id, aggregate_type, aggregate_id, n FROM counts
    ORDER BY tenant_id, aggregate_type, aggregate_id
    ON CONFLICT (tenant_id, aggregate_type, aggregate_id)
    DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
    RETURNING tenant_id, aggregate_type, aggregate_id, last_seq
)
INSERT INTO %[2]s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
SELECT i.event_id, i.tenant_id, i.aggregate_type, i.aggregate_id, seq.last_seq - c.n + i.ord, i.event_type, i.schema_version,
    i.topic, i.shard, $19, i.content_type, i.payload, i.occurred_at,
    i.traceparent, i.correlation_id, i.causation_id, i.principal, i.action, i.target, now()
FROM input i
JOIN counts c USING (tenant_id, aggregate_type, aggregate_id)
JOIN seq USING (tenant_id, aggregate_type, aggregate_id)%[3]s
ORDER BY i.pos
RETURNING aggregate_seq`, t.Name("aggregate_seq"), t.Name("outbox"), notifyJoin)
}

// postgresInsertOneSQL is the single-event form of postgresInsertSQL: no
// arrays to unnest and nothing to group, so the planner has less to do on
// the most common call.
func postgresInsertOneSQL(t ferry.Tables, notify string) string {
	notifyJoin := ""
	if notify != "" {
		notifyJoin = fmt.Sprintf(" CROSS JOIN (SELECT pg_notify('%s', '')) AS n", notify)
	}
	return fmt.Sprintf(`WITH seq AS (
    INSERT INTO %[1]s AS s (tenant_id, aggregate_type, aggregate_id, last_seq) VALUES ($2, $3, $4, 1)
    ON CONFLICT (tenant_id, aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq
)
INSERT INTO %[2]s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
SELECT $1, $2, $3, $4, seq.last_seq, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, now()
FROM seq%[3]s
RETURNING aggregate_seq`, t.Name("aggregate_seq"), t.Name("outbox"), notifyJoin)
}

func (w *Writer[TTx]) writePostgresOne(ctx context.Context, exec driver.Executor, e *ferry.Event) error {
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	h := e.Headers
	rows, err := exec.Query(ctx, w.insertOne, e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, e.EventType, int32(e.SchemaVersion),
		e.Topic, int32(e.Shard), int32(w.cfg.shards), e.ContentType, payload, e.OccurredAt,
		h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return fmt.Errorf("outbox: insert returned no row")
	}
	if err := rows.Scan(&e.AggregateSeq); err != nil {
		return err
	}
	return rows.Err()
}

func (w *Writer[TTx]) writePostgres(ctx context.Context, exec driver.Executor, events []ferry.Event) error {
	n := len(events)
	if n == 1 {
		return w.writePostgresOne(ctx, exec, &events[0])
	}
	var (
		ids, tenants, aggTypes, aggIDs, types, topics, cts = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		tps, corrs, causes, principals, actions, targets   = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ords                                               = make([]int64, n)
		versions, shards                                   = make([]int32, n), make([]int32, n)
		payloads                                           = make([][]byte, n)
		occurred                                           = make([]time.Time, n)
	)
	pos := map[aggKey]int64{}
	for i := range events {
		e := &events[i]
		k := aggKey{e.TenantID, e.AggregateType, e.AggregateID}
		pos[k]++
		ids[i], tenants[i], aggTypes[i], aggIDs[i], ords[i] = e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, pos[k]
		types[i], versions[i], topics[i], shards[i], cts[i] = e.EventType, int32(e.SchemaVersion), e.Topic, int32(e.Shard), e.ContentType
		payloads[i], occurred[i] = e.Payload, e.OccurredAt
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		h := e.Headers
		tps[i], corrs[i], causes[i], principals[i], actions[i], targets[i] = h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target
	}
	rows, err := exec.Query(ctx, w.insert, ids, tenants, aggTypes, aggIDs, ords, types, versions,
		topics, shards, cts, payloads, occurred, tps, corrs, causes, principals, actions, targets, int32(w.cfg.shards))
	if err != nil {
		return err
	}
	defer rows.Close()
	i := 0
	for rows.Next() {
		if i >= n {
			return fmt.Errorf("outbox: insert returned more rows than events")
		}
		if err := rows.Scan(&events[i].AggregateSeq); err != nil {
			return err
		}
		i++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if i != n {
		return fmt.Errorf("outbox: insert returned %d rows for %d events", i, n)
	}
	return nil
}
