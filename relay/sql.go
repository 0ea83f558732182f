package relay

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// queries holds the relay's SQL for one dialect, rendered once in New.
//
// Time: Postgres uses the database clock (now()) for every lease and retry
// timestamp, so relays on hosts with skewed clocks agree on expiry. SQLite
// is in-process, so its clock (strftime 'now') is the host's.
//
// Lists of rows travel as one JSON parameter (jsonb_to_recordset on
// Postgres, json_each on SQLite), so a whole batch is marked in one
// statement with the same SQL in both dialects.
type queries struct {
	dialect     driver.Dialect
	partitioned bool // see queryOpts.partitioned
	pipeline    bool // see queryOpts.pipeline

	hasDiscarded    string
	checkShards     string
	ensureLeases    string
	heartbeat       string
	pruneInstance   string
	liveInstances   string
	otherShardCount string
	renew           string
	adopt           string
	acquire         string
	release         string
	releaseAll      string
	deleteSelf      string
	claim           string
	markSent        string
	markFailed      string

	// WithSentWatermark (watermark.go)
	watermark    bool
	advance      string // move shards' sent_up_to, holding the rows it passes unsent
	stateInUse   string // is the watermark state in use (status-mode relays refuse then)
	otherState   string // live relays of the other state design
	hasWatermark string // did migration 0012 run
	idCache      string // the outbox identity's CACHE

	mysqlLeases map[string]mysqlLease // MySQL: lease statements without RETURNING
}

// sqliteNow is SQLite's clock in the text format the outbox writer uses
// (sortable as text when every value is UTC).
const sqliteNow = `strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')`

// queryOpts are the switches newQueries renders.
type queryOpts struct {
	noFence   bool // test hook: the negative control
	syncMarks bool // WithSynchronousMarks
	// discarded: the outbox has ops' discarded_at column (migration 0005);
	// a dead row an operator discarded no longer holds its aggregate.
	discarded bool
	// tenantShare (WithTenantShare): at most this many rows per tenant per
	// shard in one claim; 0 = off.
	tenantShare int
	// partitioned: the outbox is partitioned by created_at (Postgres,
	// migrate.WithPartitionedOutbox). The claim reads created_at and the
	// marks match on it, so each row's update is pruned at run time to its
	// own partition instead of probing every partition's primary key.
	partitioned bool
	// watermark: WithSentWatermark (Postgres): acked rows are not
	// updated; the shard's relay_leases.sent_up_to moves instead.
	watermark bool
	// pipeline: WithShardPipeline > 1 (Postgres, status design): the
	// claim takes the rows in flight as $3 and leaves them out.
	pipeline bool
	// noSnapshotWait: test hook, the late-commit negative control.
	noSnapshotWait bool
	// xipOnlyWait: test hook, the control of the claim's transaction id:
	// the earlier rule that waited for the claim snapshot's xip only.
	xipOnlyWait bool
}

func newQueries(d driver.Dialect, t ferry.Tables, policy DeadPolicy, o queryOpts) (*queries, error) {
	noFence, syncMarks := o.noFence, o.syncMarks
	var now string
	var plus func(secs string) string // now + secs (a float8 expression)
	var rowsOf func(param string, cols ...string) string
	switch d {
	case driver.Postgres:
		now = "now()"
		plus = func(s string) string { return "now() + make_interval(secs => " + s + ")" }
		types := map[string]string{"id": "bigint", "fence": "bigint", "receipt": "text", "delay": "float8", "dead": "boolean", "err": "text", "charge": "int",
			"created_at": "timestamptz"}
		rowsOf = func(p string, cols ...string) string {
			defs := make([]string, len(cols))
			for i, c := range cols {
				defs[i] = c + " " + types[c]
			}
			return fmt.Sprintf("jsonb_to_recordset(%s::jsonb) AS m(%s)", p, strings.Join(defs, ", "))
		}
	case driver.SQLite:
		now = sqliteNow
		plus = func(s string) string {
			return `strftime('%Y-%m-%d %H:%M:%f+00:00', 'now', printf('%.3f seconds', ` + s + `))`
		}
		rowsOf = func(p string, cols ...string) string {
			sel := make([]string, len(cols))
			for i, c := range cols {
				sel[i] = fmt.Sprintf("json_extract(value, '$.%s') AS %s", c, c)
			}
			return fmt.Sprintf("(SELECT %s FROM json_each(%s)) AS m", strings.Join(sel, ", "), p)
		}
	case driver.MySQL:
		now, plus, rowsOf = mysqlNow, mysqlPlus, mysqlRowsOf
	default:
		return nil, &ferry.ConfigError{Field: "dialect", Reason: fmt.Sprintf("unsupported dialect %q", d)}
	}
	outbox, leases, inst := t.Name("outbox"), t.Name("relay_leases"), t.Name("relay_instances")
	q := &queries{dialect: d, partitioned: o.partitioned, pipeline: o.pipeline && d == driver.Postgres && !o.watermark}

	q.hasDiscarded = fmt.Sprintf(`SELECT count(*) FROM information_schema.columns
WHERE table_name = '%s' AND column_name = 'discarded_at' AND table_schema = %s`, t.Bare("outbox"), "current_schema()")
	if t.Schema != "" {
		q.hasDiscarded = strings.Replace(q.hasDiscarded, "current_schema()", "'"+t.Schema+"'", 1)
	}
	if d == driver.SQLite {
		q.hasDiscarded = fmt.Sprintf(`SELECT count(*) FROM pragma_table_info('%s') WHERE name = 'discarded_at'`, t.Bare("outbox"))
	}
	// Rows a relay could still publish under another N: pending ones and
	// dead letters an operator may retry; a discarded dead letter is gone
	// for good (ops' migration 0005 adds discarded_at).
	publishable := ""
	if o.discarded {
		publishable = " AND NOT (status = 'dead' AND discarded_at IS NOT NULL)"
	}
	q.checkShards = fmt.Sprintf(`SELECT shard_count, SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END)
FROM %s WHERE status <> 'sent' AND shard_count <> $1%s
GROUP BY shard_count ORDER BY count(*) DESC LIMIT 1`, outbox, publishable)
	q.ensureLeases = fmt.Sprintf(`WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < CAST($1 AS INTEGER))
INSERT INTO %s (shard) SELECT n FROM s WHERE true ON CONFLICT (shard) DO NOTHING`, leases)
	q.heartbeat = fmt.Sprintf(`INSERT INTO %s (instance_id, shard_count, heartbeat_at, expires_at, breaker) VALUES ($1, $2, %s, %s, $4)
ON CONFLICT (instance_id) DO UPDATE SET shard_count = excluded.shard_count, heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, breaker = excluded.breaker`,
		inst, now, plus("$3"))
	q.pruneInstance = fmt.Sprintf(`DELETE FROM %s WHERE expires_at <= %s`, inst, now)
	q.otherShardCount = fmt.Sprintf(`SELECT shard_count FROM %s WHERE expires_at > %s AND shard_count <> $1 AND instance_id <> $2 LIMIT 1`, inst, now)
	q.liveInstances = fmt.Sprintf(`SELECT count(*), COALESCE(SUM(CASE WHEN shard_count <> $1 THEN 1 ELSE 0 END), 0) FROM %s WHERE expires_at > %s`, inst, now)
	q.renew = fmt.Sprintf(`UPDATE %s SET expires_at = %s WHERE owner = $1 AND expires_at > %s AND shard < $3 RETURNING shard, fence`, leases, plus("$2"), now)
	q.adopt = fmt.Sprintf(`UPDATE %s SET fence = fence + 1, expires_at = %s WHERE owner = $1 AND shard < $3 RETURNING shard, fence`, leases, plus("$2"))
	lock := ""
	if d == driver.Postgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	q.acquire = fmt.Sprintf(`UPDATE %[1]s SET owner = $1, fence = fence + 1, expires_at = %[2]s
WHERE shard IN (SELECT shard FROM %[1]s WHERE expires_at <= %[3]s AND shard < $4 ORDER BY shard LIMIT $3%[4]s)
  AND expires_at <= %[3]s
RETURNING shard, fence`, leases, plus("$2"), now, lock)
	q.release = fmt.Sprintf(`UPDATE %s SET owner = '', expires_at = %s WHERE owner = $1 AND shard = $2`, leases, now)
	q.releaseAll = fmt.Sprintf(`UPDATE %s SET owner = '', expires_at = %s WHERE owner = $1`, leases, now)
	q.deleteSelf = fmt.Sprintf(`DELETE FROM %s WHERE instance_id = $1`, inst)

	// Head-of-line per aggregate: a row waits while an earlier row of its
	// aggregate is unsent and not due (backing off), or dead under DeadHold.
	// An earlier row that is due has a lower id (per aggregate, id order is
	// sequence order: the producer allocates both under the aggregate's row
	// lock) and so is claimed first, in the same batch.
	//
	// The blocking rows of the owned shards are collected once per claim
	// (outbox_pending_idx for the backing-off ones, outbox_dead_shard_idx for the
	// dead ones; both are few), and candidate rows are checked against that
	// small set before the LIMIT, so a held aggregate with a long tail
	// never fills a shard's share of the batch and starves the others.
	blocking := fmt.Sprintf("(p.status = 'pending' AND p.next_attempt_at > %s)", now)
	if policy == DeadHold {
		dead := "p.status = 'dead'"
		if o.discarded {
			dead = "(p.status = 'dead' AND p.discarded_at IS NULL)"
		}
		blocking = fmt.Sprintf("(%s OR %s)", blocking, dead)
	}
	// WithTenantShare: of the due, unblocked rows above, each tenant
	// contributes at most n, the first n by id (ROW_NUMBER over the
	// tenant's rows in id order; window functions exist on Postgres,
	// SQLite >= 3.25 and MySQL 8 / MariaDB 10.2). Every condition of the
	// claim is applied before the ranking, so a held aggregate's rows take
	// no share, and the LIMIT after it, in id order. Per aggregate the
	// claimed rows stay a consecutive prefix of its due rows: an aggregate
	// belongs to one tenant, and a tenant's first n rows by id hold a
	// prefix of each of its aggregates (per aggregate, id order is
	// sequence order); the id-ordered LIMIT keeps a prefix of that again.
	shareHead, shareTail := "", ""
	if o.tenantShare > 0 {
		shareHead = "(SELECT o.*, ROW_NUMBER() OVER (PARTITION BY o.tenant_id ORDER BY o.id) AS ferry_tenant_rank\n    FROM "
		shareTail = fmt.Sprintf("\n    ) o WHERE o.ferry_tenant_rank <= %d", o.tenantShare)
	}
	cols := `o.id, o.event_id, o.tenant_id, o.aggregate_type, o.aggregate_id, o.aggregate_seq, o.event_type, o.schema_version,
    o.topic, o.shard, o.content_type, o.payload, o.occurred_at, o.traceparent, o.correlation_id, o.causation_id,
    o.principal, o.action, o.target, o.attempts`
	if o.partitioned {
		cols += ", o.created_at"
	}
	// On Postgres the shard is bounded by row comparisons on (shard, id)
	// and the rows ordered by (shard, id), not pinned by equality and
	// ordered by id: with "shard = s.shard" the planner drops shard from
	// the ordering and may read the primary key in id order, filtering
	// status — cheap while the statistics say most rows are pending, but
	// once they are stale (a backlog just drained, before autoanalyze) every
	// claim walks every sent row of the table (measured: 1.0 s and 1.46M
	// buffers per empty claim after a 100,000-event drain). Ordered by
	// (shard, id) only outbox_claim_idx returns the rows in order, so the
	// plan no longer depends on the statistics. Ids are positive, so the
	// bounds select exactly the shard's rows.
	shardsIs, shardIs, materialized := "= ANY($1::int[])",
		">= s.shard AND (o.shard, o.id) > (s.shard, 0) AND (o.shard, o.id) < (s.shard + 1, 0)", " MATERIALIZED"
	order := "o.shard, o.id"
	if d != driver.Postgres {
		// In-process: one query per shard costs a function call (MySQL:
		// one statement per owned shard, see mysql.go).
		shardsIs, shardIs, materialized, order = "= $1", "= $1", "", "o.id"
	}
	claim := fmt.Sprintf(`WITH blocked AS%[6]s (
    SELECT p.tenant_id, p.aggregate_type, p.aggregate_id, min(p.aggregate_seq) AS seq
    FROM %[1]s p WHERE p.shard %[2]s AND %[4]s
    GROUP BY p.tenant_id, p.aggregate_type, p.aggregate_id
)
SELECT %[7]s FROM %[8]s (
    SELECT * FROM %[9]s%[1]s o
    WHERE o.shard %[3]s AND o.status = 'pending' AND o.next_attempt_at <= %[5]s
      AND NOT EXISTS (SELECT 1 FROM blocked b
          WHERE b.tenant_id = o.tenant_id AND b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
            AND b.seq < o.aggregate_seq)%[10]s
    ORDER BY %[11]s LIMIT {{limit}}) o{{where}}`, outbox, shardsIs, shardIs, blocking, now, materialized, "{{cols}}", "{{from}}", shareHead, shareTail, order)
	if d == driver.Postgres {
		// One round trip for every owned shard: k rows per shard, each
		// read in id order from outbox_claim_idx.
		from, limit, where := "unnest($1::int[]) AS s(shard) CROSS JOIN LATERAL", "$2", ""
		if q.pipeline {
			// WithShardPipeline: $3 are the rows in flight in other
			// batches of these shards, $4 (per shard, in $1's order) how
			// many. They are left out after each shard's LIMIT, which
			// grows by their number: filtered inside it, they make the
			// planner expect a sparse shard and read and sort all of it
			// instead of outbox_claim_idx in order (measured: 25 ms
			// against 1.7 ms at 20,000 pending rows). The relay keeps at
			// most $2 of each shard's rows. A hashed subplan: one hash
			// per claim, one probe per row.
			from, limit, where = "unnest($1::int[], $4::int[]) AS s(shard, in_flight) CROSS JOIN LATERAL", "$2 + s.in_flight",
				"\nWHERE o.id NOT IN (SELECT unnest($3::bigint[]))"
		}
		q.claim = strings.NewReplacer("{{cols}}", strings.ReplaceAll(cols, "o.event_id", "o.event_id::text"),
			"{{from}}", from, "{{limit}}", limit, "{{where}}", where).Replace(claim)
	} else {
		q.claim = strings.NewReplacer("{{cols}}", cols, "{{from}}", "", "{{limit}}", "$2", "{{where}}", "").Replace(claim)
	}

	// Marks commit asynchronously on Postgres (synchronous_commit off for
	// that one statement's transaction): a mark lost to a database crash
	// only makes the row pending again, i.e. a republish under the same
	// event id, which at-least-once delivery already allows. It saves a
	// WAL flush per batch. The claim is read-only; the broker ack, which
	// is what G2 rests on, came before.
	withAsync, async := "", ""
	if d == driver.Postgres && !syncMarks {
		withAsync = "WITH async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))\n"
		async = ", async_commit"
	}
	// The fence is a scalar subquery per row (the lease of the row's shard
	// by primary key), not a join: as a join the planner may start from
	// the lease table and fan out, e.g. hashing every batch row against
	// every lease with the same fence value (all 1 in a new deployment).
	fence := fmt.Sprintf(`(SELECT l.fence FROM %[1]s l WHERE l.shard = %[2]s.shard AND l.owner = $1 AND l.expires_at > %[3]s) = m.fence`,
		leases, outbox, now)
	if noFence {
		fence = "CAST($1 AS TEXT) = CAST($1 AS TEXT)" // keeps $1 typed
		if d == driver.MySQL {
			fence = "CAST($1 AS CHAR) = CAST($1 AS CHAR)"
		}
	}
	sentCols, failedCols := []string{"id", "fence", "receipt"}, []string{"id", "fence", "delay", "dead", "err", "charge"}
	byKey := "%[1]s.id = m.id"
	if o.partitioned {
		sentCols, failedCols = append(sentCols, "created_at"), append(failedCols, "created_at")
		byKey = "%[1]s.id = m.id AND %[1]s.created_at = m.created_at"
	}
	q.markSent = fmt.Sprintf(`%[6]sUPDATE %[1]s SET status = 'sent', published_at = %[2]s, broker_receipt = m.receipt
FROM %[3]s%[5]s
WHERE `+byKey+` AND %[1]s.status = 'pending' AND %[4]s`,
		outbox, now, rowsOf("$2", sentCols...), fence, async, withAsync)
	q.markFailed = fmt.Sprintf(`%[6]sUPDATE %[1]s SET attempts = %[1]s.attempts + m.charge,
    status = CASE WHEN m.dead THEN 'dead' ELSE 'pending' END,
    next_attempt_at = %[2]s, last_error = m.err
FROM %[3]s%[5]s
WHERE `+byKey+` AND %[1]s.status = 'pending' AND %[4]s`,
		outbox, plus("m.delay"), rowsOf("$2", failedCols...), fence, async, withAsync)
	if d == driver.MySQL {
		mysqlQueries(q, t, now, plus, fence)
	}
	if d == driver.Postgres {
		watermarkQueries(q, t, o, watermarkParts{cols: cols, fence: fence, withAsync: withAsync, async: async,
			rowsOf: rowsOf, byKey: byKey, sentCols: sentCols, failedCols: failedCols, deadHold: policy == DeadHold})
	}
	return q, nil
}

// shardsParam encodes a shard list for the dialect's claim form.
func (q *queries) shardsParam(shards []int) any {
	if q.dialect == driver.Postgres {
		out := make([]int32, len(shards))
		for i, s := range shards {
			out[i] = int32(s)
		}
		return out
	}
	b, _ := json.Marshal(shards)
	return string(b)
}

type sentRow struct {
	ID      int64  `json:"id"`
	Fence   int64  `json:"fence"`
	Receipt string `json:"receipt"`
	// CreatedAt is the row's partition key (partitioned outbox only).
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

type failedRow struct {
	ID    int64   `json:"id"`
	Fence int64   `json:"fence"`
	Delay float64 `json:"delay"` // seconds until the next attempt
	Dead  bool    `json:"dead"`
	Err   string  `json:"err"`
	// Charge is the attempts the failure costs: 1, or 0 for a row held
	// because its destination is missing (a configuration fault).
	Charge int `json:"charge"`
	// CreatedAt is the row's partition key (partitioned outbox only).
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

func jsonParam(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("relay: encode batch: %w", err)
	}
	return string(b), nil
}
