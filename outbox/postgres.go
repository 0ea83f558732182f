package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// inputCTE turns the array arguments $1…$18 of the multi-event statements
// into rows; ord is an event's 1-based position within its aggregate in the
// call, pos its position in the call.
const inputCTE = `WITH input AS (
    SELECT * FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[],
        $8::text[], $9::int[], $10::text[], $11::bytea[], $12::timestamptz[],
        $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[]
    ) WITH ORDINALITY AS i(event_id, tenant_id, aggregate_type, aggregate_id, ord, event_type, schema_version,
        topic, shard, content_type, payload, occurred_at,
        traceparent, correlation_id, causation_id, principal, action, target, pos)
)`

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
	return fmt.Sprintf(inputCTE+`, counts AS (
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

// postgresExpectedSQL writes the events of one aggregate whose caller
// supplied their versions, in one statement and without a savepoint: the
// sequence row is claimed only if it still holds the expected version, and
// when it does not, the statement writes nothing and raises no error, so
// the caller's transaction stays usable.
//
// For an existing aggregate ($20 = expected > 0) the UPDATE takes the row
// lock; in READ COMMITTED a writer that waited for it re-checks last_seq
// against the committed row, so of two writers supplying the same version
// exactly one succeeds. For a new aggregate (expected 0) the INSERT … ON
// CONFLICT DO NOTHING claims the key; a concurrent creator makes it a no-op.
// $19 is shard_count, $21 the number of events.
func postgresExpectedSQL(t ferry.Tables, notify string, create bool) string {
	notifyJoin := ""
	if notify != "" {
		notifyJoin = fmt.Sprintf("\n    CROSS JOIN (SELECT pg_notify('%s', '')) AS n", notify)
	}
	claim := fmt.Sprintf(`UPDATE %s SET last_seq = last_seq + $21::bigint
    WHERE tenant_id = $2[1] AND aggregate_type = $3[1] AND aggregate_id = $4[1] AND last_seq = $20::bigint
    RETURNING last_seq`, t.Name("aggregate_seq"))
	if create {
		claim = fmt.Sprintf(`INSERT INTO %s (tenant_id, aggregate_type, aggregate_id, last_seq)
    SELECT $2[1], $3[1], $4[1], $21::bigint WHERE $20::bigint = 0
    ON CONFLICT (tenant_id, aggregate_type, aggregate_id) DO NOTHING
    RETURNING last_seq`, t.Name("aggregate_seq"))
	}
	return fmt.Sprintf(inputCTE+`, seq AS (
    %[1]s
)
INSERT INTO %[2]s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
SELECT i.event_id, i.tenant_id, i.aggregate_type, i.aggregate_id, seq.last_seq - $21 + i.ord, i.event_type, i.schema_version,
    i.topic, i.shard, $19, i.content_type, i.payload, i.occurred_at,
    i.traceparent, i.correlation_id, i.causation_id, i.principal, i.action, i.target, now()
FROM input i CROSS JOIN seq%[3]s
ORDER BY i.pos
RETURNING aggregate_seq`, claim, t.Name("outbox"), notifyJoin)
}

// postgresExpectedOneSQL is the single-event form of postgresExpectedSQL
// (the arguments of postgresInsertOneSQL, then the expected version as $19).
func postgresExpectedOneSQL(t ferry.Tables, notify string, create bool) string {
	notifyJoin := ""
	if notify != "" {
		notifyJoin = fmt.Sprintf(" CROSS JOIN (SELECT pg_notify('%s', '')) AS n", notify)
	}
	claim := fmt.Sprintf(`UPDATE %s SET last_seq = last_seq + 1
    WHERE tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4 AND last_seq = $19::bigint
    RETURNING last_seq`, t.Name("aggregate_seq"))
	if create {
		claim = fmt.Sprintf(`INSERT INTO %s (tenant_id, aggregate_type, aggregate_id, last_seq)
    SELECT $2, $3, $4, 1 WHERE $19::bigint = 0
    ON CONFLICT (tenant_id, aggregate_type, aggregate_id) DO NOTHING
    RETURNING last_seq`, t.Name("aggregate_seq"))
	}
	return fmt.Sprintf(`WITH seq AS (
    %[1]s
)
INSERT INTO %[2]s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
SELECT $1, $2, $3, $4, seq.last_seq, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, now()
FROM seq%[3]s
RETURNING aggregate_seq`, claim, t.Name("outbox"), notifyJoin)
}

func (w *Writer[TTx]) writePostgresOne(ctx context.Context, exec driver.Executor, e *ferry.Event) error {
	rows, err := exec.Query(ctx, w.insertOne, postgresOneArgs(e, int32(w.cfg.shards))...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return fmt.Errorf("returned no row")
	}
	if err := rows.Scan(&e.AggregateSeq); err != nil {
		return err
	}
	return rows.Err()
}

// postgresOneArgs returns the arguments $1…$18 of the single-event
// statements.
func postgresOneArgs(e *ferry.Event, shardCount int32) []any {
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	h := e.Headers
	return []any{e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, e.EventType, int32(e.SchemaVersion),
		e.Topic, int32(e.Shard), shardCount, e.ContentType, payload, e.OccurredAt,
		h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target}
}

func (w *Writer[TTx]) writePostgres(ctx context.Context, exec driver.Executor, events []ferry.Event) error {
	if len(events) == 1 {
		return w.writePostgresOne(ctx, exec, &events[0])
	}
	rows, err := exec.Query(ctx, w.insert, postgresArrays(events, int32(w.cfg.shards))...)
	if err != nil {
		return err
	}
	n, err := scanSeqs(rows, events)
	if err != nil {
		return err
	}
	if n != len(events) {
		return fmt.Errorf("returned %d rows for %d events", n, len(events))
	}
	return nil
}

// writePostgresExpected writes the events of one aggregate whose versions
// the caller supplied (see postgresExpectedSQL). On a mismatch it returns a
// *ferry.SequenceConflictError and nothing is written.
func (w *Writer[TTx]) writePostgresExpected(ctx context.Context, exec driver.Executor, events []ferry.Event) error {
	first := events[0]
	expected := first.AggregateSeq - 1
	var (
		q    string
		args []any
	)
	if len(events) == 1 {
		q = w.expectedOne[expected == 0]
		args = append(postgresOneArgs(&events[0], int32(w.cfg.shards)), expected)
	} else {
		q = w.expected[expected == 0]
		args = append(postgresArrays(events, int32(w.cfg.shards)), expected, int64(len(events)))
	}
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	n, err := scanSeqs(rows, events) // on success the supplied versions come back unchanged
	if err != nil {
		return err
	}
	switch n {
	case len(events):
		return nil
	case 0: // the sequence row did not hold the expected version; nothing was written
		var last int64
		if _, err := driver.QueryRow(ctx, exec, w.lastSeq, []any{first.TenantID, first.AggregateType, first.AggregateID}, &last); err != nil {
			return fmt.Errorf("read sequence after conflict: %w", err)
		}
		return &ferry.SequenceConflictError{TenantID: first.TenantID, AggregateType: first.AggregateType, AggregateID: first.AggregateID,
			Expected: first.AggregateSeq, Next: last + 1}
	default:
		return fmt.Errorf("returned %d rows for %d events", n, len(events))
	}
}

// postgresArrays returns the array arguments $1…$18 of the multi-event
// statements, and shard_count as $19.
func postgresArrays(events []ferry.Event, shardCount int32) []any {
	n := len(events)
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
	return []any{ids, tenants, aggTypes, aggIDs, ords, types, versions,
		topics, shards, cts, payloads, occurred, tps, corrs, causes, principals, actions, targets, shardCount}
}

// scanSeqs reads the returned sequences into events in order and returns
// how many rows there were.
func scanSeqs(rows driver.Rows, events []ferry.Event) (int, error) {
	defer rows.Close()
	i := 0
	for rows.Next() {
		if i >= len(events) {
			return i, fmt.Errorf("returned more rows than events")
		}
		if err := rows.Scan(&events[i].AggregateSeq); err != nil {
			return i, err
		}
		i++
	}
	return i, rows.Err()
}
