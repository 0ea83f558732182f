package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/outboxstate"
)

// The watermark state design (WithSentWatermark, Postgres).
//
// Today's relay marks every acked row 'sent': a non-HOT update of the wide
// event row, its WAL and an entry in every index — two thirds of a cycle
// (docs/PERFORMANCE.md). In the watermark design an acked row is not
// written at all. Each shard's lease row carries sent_up_to, and a row of
// the shard is sent when it is 'pending' at or below it (or 'sent', for a
// row sent after a retry). The watermark moves once per shard per batch,
// fenced like every mark.
//
// What the design must keep, and how:
//
//   - Sent only after the ack (G2). sent_up_to moves to u only when every
//     row of the shard with id <= u is acked, or was given a state of its
//     own: 'retry' (failed; held behind its aggregate's failed head; held
//     for a missing or unavailable destination; left out of the batch), or
//     'dead'. The advance writes those 'retry' states itself, in the same
//     statement, for every pending row it passes that is not in its acked
//     list — so a row the relay did not publish is never read as sent.
//   - Late commits. Identity values commit out of order. The claim takes a
//     transaction id of its own (pg_current_xact_id, after its snapshot);
//     the watermark passes the claimed rows only once every transaction
//     with a lower id has ended — the advance's snapshot xmin is above it
//     — and a row such a transaction committed meanwhile is then visible
//     to the advance, which holds it as 'retry' (due now) instead of
//     passing it. This relies on the inserting transaction holding its
//     xid before it takes the id: Ferry's writer upserts aggregate_seq
//     first, and the outbox identity has no cache (CACHE 1, the default).
//     The claim snapshot's xip alone is not enough: a snapshot's xmax is
//     one past the latest *completed* xid, so a transaction that took its
//     xid after one that has committed, and is still running, is in no
//     snapshot's xip. If it took its outbox id before the committed one
//     took a higher id, a watermark waiting for the xip only passed its
//     row unseen and it read as sent, never published (CI lost 1 of 5,392
//     events so; TestWatermarkWaitsAboveTheSnapshotXmax). The claim's xid
//     costs a commit record written without a flush (the claim writes no
//     other WAL), only when the claim returns rows.
//   - Long producer transactions hold the watermark, not publication: the
//     relay keeps the ids it published and the broker acked above the
//     watermark, and the claim skips them until the watermark passes them.
//     A crash or a lost lease drops them: the rows above the watermark are
//     published again under the same event ids (at-least-once, as today).
//   - Per-aggregate order and DeadHold: the claim's blocking set is the
//     retry rows not yet due and (DeadHold) the dead rows, read through
//     small partial indexes; rows are claimed in id order.
//   - The fence: the advance updates the lease row itself, under the
//     owner and fence the rows were claimed with, so a fenced relay moves
//     nothing.

// watermarkParts are the pieces of newQueries the watermark statements
// share with the status design's.
type watermarkParts struct {
	cols                 string // claimed columns, "o." qualified
	fence                string // per-row fence predicate on the outbox
	withAsync, async     string // asynchronous commit of marks
	rowsOf               func(param string, cols ...string) string
	byKey                string // a mark's row match, %[1]s = the outbox
	sentCols, failedCols []string
	deadHold             bool
}

func watermarkQueries(q *queries, t ferry.Tables, o queryOpts, p watermarkParts) {
	outbox, leases, inst := t.Name("outbox"), t.Name("relay_leases"), t.Name("relay_instances")
	q.hasWatermark = fmt.Sprintf(`SELECT count(*) FROM information_schema.columns
WHERE table_name = '%s' AND column_name = 'sent_up_to' AND table_schema = %s`, t.Bare("relay_leases"), schemaOf(t))
	q.stateInUse = outboxstate.InUse(t)
	q.idCache = fmt.Sprintf(`SELECT COALESCE((SELECT s.seqcache FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence('%s', 'id')::regclass), 1)`,
		strings.ReplaceAll(outbox, "'", "''"))
	q.otherState = fmt.Sprintf(`SELECT count(*) FROM %s WHERE expires_at > now() AND relay_state <> $1 AND instance_id <> $2`, inst)
	if !o.watermark {
		return
	}
	q.watermark = true
	// The reshard check (relay.go, start): rows written with another
	// shard count that a relay could still publish. In this design the
	// pending rows at or below their shard's watermark are sent, so the
	// pending side is read per shard above the watermark (a range of
	// outbox_claim_idx, outboxstate.AboveWatermark), not as every pending
	// row of the table.
	publishable := ""
	if o.discarded {
		publishable = " AND NOT (o.status = 'dead' AND o.discarded_at IS NOT NULL)"
	}
	q.checkShards = fmt.Sprintf(`WITH RECURSIVE %[2]s
SELECT u.shard_count, SUM(CASE WHEN u.status <> 'dead' THEN 1 ELSE 0 END), SUM(CASE WHEN u.status = 'dead' THEN 1 ELSE 0 END)
FROM (
    SELECT o.shard_count, o.status FROM %[1]s o WHERE o.status IN ('retry', 'dead') AND o.shard_count <> $1%[4]s
  UNION ALL
    SELECT x.shard_count, x.status FROM %[3]s WHERE x.shard_count <> $1
) u GROUP BY u.shard_count ORDER BY count(*) DESC LIMIT 1`,
		outbox, outboxstate.ShardsWithPending(t, "true"), outboxstate.AboveWatermark(t, "x.shard_count, x.status"), publishable)
	q.heartbeat = fmt.Sprintf(`INSERT INTO %s (instance_id, shard_count, heartbeat_at, expires_at, breaker, relay_state) VALUES ($1, $2, now(), now() + make_interval(secs => $3), $4, 'watermark')
ON CONFLICT (instance_id) DO UPDATE SET shard_count = excluded.shard_count, heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, breaker = excluded.breaker, relay_state = excluded.relay_state`, inst)

	// Blocking rows: retry rows not yet due hold their aggregate's later
	// rows; under DeadHold, dead ones too (not once discarded).
	blocking := "(p.status = 'retry' AND p.next_attempt_at > now())"
	if p.deadHold {
		dead := "p.status = 'dead'"
		if o.discarded {
			dead = "(p.status = 'dead' AND p.discarded_at IS NULL)"
		}
		blocking = "(" + blocking + " OR " + dead + ")"
	}
	notBlocked := `NOT EXISTS (SELECT 1 FROM blocked b
          WHERE b.tenant_id = o.tenant_id AND b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
            AND b.seq < o.aggregate_seq)`
	cols := strings.ReplaceAll(p.cols, "o.event_id", "o.event_id::text")
	// Two arms, each read in id order from its own partial index: the
	// pending rows above the shard's watermark (outbox_claim_idx, bounded
	// by (shard, id) like the status claim) that this relay has not
	// already published ($3: acked rows the watermark could not pass yet),
	// and the due retry rows (outbox_retry_idx, few). Together they are
	// the status claim's candidates. The lowest $2 ids of the two arms'
	// first $2 each are the lowest $2 of all candidates, so the batch is
	// still a prefix in id order: an aggregate's earlier due row is
	// claimed before its later ones.
	//
	// WithTenantShare: each tenant contributes at most n rows, its first
	// n by id, ranked over every candidate of the shard like the status
	// claim (so the arms are not limited before the ranking).
	armLimit, shareHead, shareTail := " LIMIT $2", "", " u"
	if o.tenantShare > 0 {
		armLimit = ""
		shareHead = "(SELECT u.*, ROW_NUMBER() OVER (PARTITION BY u.tenant_id ORDER BY u.id) AS ferry_tenant_rank FROM "
		shareTail = fmt.Sprintf(" u) u WHERE u.ferry_tenant_rank <= %d", o.tenantShare)
	}
	horizon := "pg_current_xact_id()::text" // "Late commits" above
	if o.xipOnlyWait {
		horizon = "pg_current_snapshot()::text"
	}
	q.claim = fmt.Sprintf(`WITH blocked AS MATERIALIZED (
    SELECT p.tenant_id, p.aggregate_type, p.aggregate_id, min(p.aggregate_seq) AS seq
    FROM %[1]s p WHERE p.shard = ANY($1::int[]) AND %[2]s
    GROUP BY p.tenant_id, p.aggregate_type, p.aggregate_id
)
SELECT %[4]s, o.status = 'retry', l.sent_up_to, %[9]s
FROM unnest($1::int[]) AS s(shard)
JOIN %[5]s l ON l.shard = s.shard
CROSS JOIN LATERAL (
    SELECT * FROM %[7]s(
        (SELECT * FROM %[1]s o
         WHERE o.shard >= s.shard AND (o.shard, o.id) > (s.shard, l.sent_up_to) AND (o.shard, o.id) < (s.shard + 1, 0)
           AND o.status = 'pending' AND o.id <> ALL($3::bigint[]) AND %[3]s
         ORDER BY o.shard, o.id%[6]s)
        UNION ALL
        (SELECT * FROM %[1]s o
         WHERE o.shard = s.shard AND o.status = 'retry' AND o.next_attempt_at <= now() AND o.id <> ALL($3::bigint[]) AND %[3]s
         ORDER BY o.id%[6]s)
    )%[8]s ORDER BY u.id LIMIT $2
) o`, outbox, blocking, notBlocked, cols, leases, armLimit, shareHead, shareTail, horizon)

	// Acked rows from the retry arm are marked like today when the
	// watermark is above them; acked rows from the pending arm, and retry
	// rows above the watermark (claim.waits), are not written here: the
	// advance passes them, making such retry rows 'pending' in the same
	// statement — so a retry row is never sent ahead of an earlier row of
	// its aggregate that was acked but not yet passed.
	q.markSent = fmt.Sprintf(`%[6]sUPDATE %[1]s SET status = 'sent', published_at = now(), broker_receipt = m.receipt
FROM %[3]s%[5]s
WHERE `+p.byKey+` AND %[1]s.status = 'retry' AND %[4]s`,
		outbox, nil, p.rowsOf("$2", p.sentCols...), p.fence, p.async, p.withAsync)
	q.markFailed = fmt.Sprintf(`%[6]sUPDATE %[1]s SET attempts = %[1]s.attempts + m.charge,
    status = CASE WHEN m.dead THEN 'dead' ELSE 'retry' END,
    next_attempt_at = now() + make_interval(secs => m.delay), last_error = m.err
FROM %[3]s%[5]s
WHERE `+p.byKey+` AND %[1]s.status IN ('pending', 'retry') AND %[4]s`,
		outbox, nil, p.rowsOf("$2", p.failedCols...), p.fence, p.async, p.withAsync)

	// The advance: $1 owner, $2 the candidates [{shard, fence, upto,
	// snap}] (one per claim the watermark has not passed), $3 the acked
	// ids above the watermarks, $4 those of them that are 'retry' rows
	// (claimed.waits; usually none), made 'pending' as they are passed. Per shard: the target is the highest upto
	// among its candidates whose claim's xid lies below this statement's
	// snapshot xmin — every transaction that took an xid before the claim
	// has ended, and a row one of them committed is visible here. Per shard whose lease still holds
	// and whose watermark is below its target: hold every pending row in
	// (sent_up_to, target] that is not acked as 'retry', due now (late
	// commits, rows behind a failed head, rows left out of the batch),
	// then move sent_up_to to the target. The lease rows are locked
	// first, so a takeover waits for this statement and the final UPDATE
	// checks owner and fence again on the newest version. It also records
	// the watermark and the time in relay_watermarks, which is what
	// cleanup's retention reads (a row passed by the watermark has no
	// published_at): a new entry when the shard's newest is a minute old,
	// else the newest moves to (target, now). So entries are a minute
	// apart, and the newest always holds the watermark. A shard whose
	// lease another relay holds now (owner or fence changed) comes back as
	// fenced: its acked rows are the new owner's to republish, and the
	// relay counts them as fenced writes. Rows: shard, new watermark, rows
	// held, fenced.
	//
	// The rows to hold are found from the shard ranges (unacked, read from
	// outbox_claim_idx), less the acked ids by EXCEPT (a hashed or sorted
	// set difference), and updated by id. Statistics mislead this
	// statement easily — every row this design sent stays 'pending', and a
	// table analysed young calls 'pending' rare — and two forms it had
	// were planned as nested loops whose cost grew with the table: the
	// update joined from every pending row (150 ms at 3,000 rows), and the
	// acked ids as a NOT EXISTS rescanned per row (415 ms for 2,000 rows
	// against 1,000 ids). docs/PERFORMANCE.md; TestWatermarkAdvancePlan.
	leaseOK, leaseStill := "l.owner = $1 AND l.expires_at > now() AND l.fence = m.fence", " AND l.owner = $1 AND l.fence = ok.fence"
	lost := "NOT (l.owner = $1 AND l.fence = c.fence)"
	if o.noFence { // the negative control
		leaseOK, leaseStill, lost = "CAST($1 AS TEXT) = CAST($1 AS TEXT)", "", "false"
	}
	ended := `pg_snapshot_xmin(pg_current_snapshot()) > c.snap::xid8`
	if o.xipOnlyWait { // the control of the claim's xid: the earlier rule
		ended = `NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(c.snap::pg_snapshot) AS x(xid)
                      WHERE NOT pg_visible_in_snapshot(x.xid, pg_current_snapshot()))`
	}
	if o.noSnapshotWait { // the negative control
		ended = "true"
	}
	head := "WITH "
	if p.withAsync != "" {
		head = "WITH async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),\n"
	}
	q.advance = fmt.Sprintf(`%[3]sc AS (SELECT * FROM jsonb_to_recordset($2::jsonb) AS c(shard int, fence bigint, upto bigint, snap text)),
m AS (SELECT c.shard, c.fence, max(c.upto) AS upto FROM c WHERE %[7]s GROUP BY c.shard, c.fence),
ok AS MATERIALIZED (
    SELECT l.shard, l.sent_up_to AS wm, m.upto, m.fence FROM m JOIN %[2]s l ON l.shard = m.shard
    WHERE %[5]s AND l.sent_up_to < m.upto
    FOR UPDATE OF l
),
unacked AS MATERIALIZED (
    SELECT x.id FROM ok CROSS JOIN LATERAL (
        SELECT x.id FROM %[1]s x
        WHERE x.shard = ok.shard AND x.id > ok.wm AND x.id <= ok.upto AND x.status = 'pending'
        ORDER BY x.shard, x.id) x
  EXCEPT
    SELECT a.id FROM unnest($3::bigint[]) AS a(id)
),
held AS (
    UPDATE %[1]s o SET status = 'retry', next_attempt_at = now()
    WHERE o.id = ANY(ARRAY(SELECT id FROM unacked)) AND o.status = 'pending'
    RETURNING o.shard
),
revived AS (
    UPDATE %[1]s o SET status = 'pending' FROM ok
    WHERE o.id = ANY($4::bigint[]) AND o.status = 'retry' AND o.shard = ok.shard AND o.id <= ok.upto
),
recent AS (
    UPDATE %[8]s h SET sent_up_to = ok.upto, at = now() FROM ok
    WHERE h.shard = ok.shard AND h.at > now() - interval '1 minute'
    RETURNING h.shard
),
history AS (
    INSERT INTO %[8]s (shard, sent_up_to, at)
    SELECT ok.shard, ok.upto, now() FROM ok
    WHERE NOT EXISTS (SELECT 1 FROM %[8]s h WHERE h.shard = ok.shard AND h.at > now() - interval '1 minute')
),
moved AS (
    UPDATE %[2]s l SET sent_up_to = ok.upto FROM ok%[4]s
    WHERE l.shard = ok.shard%[6]s
    RETURNING l.shard, l.sent_up_to, (SELECT count(*) FROM held h WHERE h.shard = l.shard) AS held
)
SELECT shard, sent_up_to, held, false FROM moved
UNION ALL
SELECT DISTINCT c.shard, 0::bigint, 0::bigint, true FROM c JOIN %[2]s l ON l.shard = c.shard WHERE %[9]s`, outbox, leases, head, p.async, leaseOK, leaseStill, ended, t.Name("relay_watermarks"), lost)
}

func schemaOf(t ferry.Tables) string {
	if t.Schema != "" {
		return "'" + t.Schema + "'"
	}
	return "current_schema()"
}

// shardWM is what a watermark relay knows about one owned shard beyond its
// lease row: rows it published and the broker acked above sent_up_to,
// which the watermark could not pass yet because a transaction running at
// their claim was still open. The claim skips them (they are not claimed
// again while they wait) and the advance passes them once it can.
// Touched only by the worker holding the shard (a shard is in one batch
// at a time), under Relay.mu for the map.
type shardWM struct {
	fence int64    // the lease this belongs to; another fence drops it
	acked []int64  // acked ids above sent_up_to
	waits []int64  // those of acked that are 'retry' rows (claimed.waits)
	cands []wmCand // claims not yet passed, oldest first (upto nondecreasing)
}

// wmCand is one claim the watermark has not passed yet: its horizon (the
// claim's xid) and the highest pending-arm id claimed up to and including
// it.
type wmCand struct {
	snap string
	upto int64
}

// top is the highest id claimed so far (0 with no claim waiting).
func (st *shardWM) top() int64 {
	if len(st.cands) == 0 {
		return 0
	}
	return st.cands[len(st.cands)-1].upto
}

// passed drops what the watermark wm now covers — acked ids and claims
// at or below it — and returns how many acked rows that was.
func (st *shardWM) passed(wm int64) int {
	st.waits = slices.DeleteFunc(st.waits, func(id int64) bool { return id <= wm })
	keep := st.acked[:0]
	for _, id := range st.acked {
		if id > wm {
			keep = append(keep, id)
		}
	}
	n := len(st.acked) - len(keep)
	st.acked = keep
	i := 0
	for i < len(st.cands) && st.cands[i].upto <= wm {
		i++
	}
	st.cands = st.cands[i:]
	return n
}

// maxDeferredAcks bounds a shard's deferred acked ids: beyond it (a producer
// transaction open for a long time) the relay forgets them and republishes
// from the watermark once the transaction ends.
const maxDeferredAcks = 100_000

// wmAcked returns the acked ids waiting above the watermarks of shards,
// dropping state that belongs to an older lease.
func (r *Relay) wmAcked(shards []int, fences map[int]int64) []int64 {
	forgot := 0
	out := []int64{}
	r.mu.Lock()
	for _, s := range shards {
		st := r.wm[s]
		if st == nil {
			continue
		}
		if st.fence != fences[s] {
			forgot += r.forgetWMLocked(s)
			continue
		}
		out = append(out, st.acked...)
	}
	r.mu.Unlock()
	r.forgotWM(forgot)
	return out
}

// forgetWMLocked drops shard s's acked rows still waiting for the advance
// once this relay no longer holds the lease they were published under
// (lost, taken over, or released): the shard's next owner republishes
// them under the same event ids. It returns how many there were; the
// caller reports them with forgotWM once r.mu is released. Caller holds
// r.mu.
func (r *Relay) forgetWMLocked(s int) int {
	st := r.wm[s]
	if st == nil {
		return 0
	}
	delete(r.wm, s)
	return len(st.acked)
}

// forgotWM counts n forgotten acked rows as fenced writes: sent states this
// relay could not record because the shard is no longer its own — what a
// mark rejected by the fence is in the status design. So Status().Fenced
// accounts for every publication a new owner repeats.
func (r *Relay) forgotWM(n int) {
	if n > 0 {
		r.fencedWrites(int64(n), "watermark")
	}
}

// advance moves the watermarks of the batch's shards past its pending-arm
// rows (acked ones pass, the statement holds the others as 'retry'), and
// of shards with acked rows waiting from earlier batches. Each claim is a
// candidate: the watermark moves to the highest upto of a claim all of
// whose earlier transactions have ended — and then those of every earlier
// claim have too (an earlier claim took a lower xid): never further than
// waiting for all of them, often sooner. Acked rows above it stay in
// memory for a later cycle.
func (r *Relay) advance(ctx context.Context, shards []int, batch []claimed, acked []bool) error {
	type target struct {
		Shard int    `json:"shard"`
		Fence int64  `json:"fence"`
		Upto  int64  `json:"upto"`
		Snap  string `json:"snap"`
	}
	var order []int
	inBatch := map[int]bool{}
	r.mu.Lock()
	if r.wm == nil {
		r.wm = map[int]*shardWM{}
	}
	for i := range batch {
		c := &batch[i]
		if c.retry && !c.waits {
			continue
		}
		s := c.ev.Shard
		st := r.wm[s]
		if st == nil || st.fence != c.fence {
			st = &shardWM{fence: c.fence}
			r.wm[s] = st
		}
		if !inBatch[s] {
			inBatch[s] = true
			order = append(order, s)
			st.cands = append(st.cands, wmCand{snap: c.snap, upto: st.top()})
		}
		cd := &st.cands[len(st.cands)-1]
		cd.upto = max(cd.upto, c.id)
		if acked[i] {
			st.acked = append(st.acked, c.id)
			if c.waits {
				st.waits = append(st.waits, c.id)
			}
		}
	}
	for _, s := range shards {
		if st := r.wm[s]; st != nil && !inBatch[s] {
			order = append(order, s)
		}
	}
	var targets []target
	var ids, waits []int64
	for _, s := range order {
		st := r.wm[s]
		for _, cd := range st.cands {
			targets = append(targets, target{Shard: s, Fence: st.fence, Upto: cd.upto, Snap: cd.snap})
		}
		ids = append(ids, st.acked...)
		waits = append(waits, st.waits...)
	}
	r.mu.Unlock()
	if len(targets) == 0 {
		return nil
	}
	p, err := jsonParam(targets)
	if err != nil {
		return err
	}
	rows, err := r.db.Executor().Query(ctx, r.q.advance, r.cfg.instance, p, ids, waits)
	if err != nil {
		return fmt.Errorf("relay: advance watermark: %w", err)
	}
	moved, fenced := map[int]int64{}, map[int]bool{}
	for rows.Next() {
		var s int
		var wm, held int64
		var lost bool
		if err := rows.Scan(&s, &wm, &held, &lost); err != nil {
			rows.Close()
			return fmt.Errorf("relay: advance watermark: %w", err)
		}
		if lost {
			fenced[s] = true
			continue
		}
		moved[s] = wm
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("relay: advance watermark: %w", err)
	}
	if r.cfg.afterMark != nil {
		r.cfg.afterMark("advance")
	}
	var published, rejected int
	r.mu.Lock()
	for _, s := range order {
		st := r.wm[s]
		if st == nil {
			continue // forgotten meanwhile: the lease loop saw the lease lost
		}
		if fenced[s] {
			rejected += r.forgetWMLocked(s) // another relay's lease
			continue
		}
		if wm, ok := moved[s]; ok {
			published += st.passed(wm)
		}
		switch {
		case len(st.cands) == 0 && len(st.acked) == 0:
			delete(r.wm, s) // the watermark covers all of them
		case len(st.acked) > maxDeferredAcks:
			delete(r.wm, s) // republish from the watermark later
		}
	}
	r.mu.Unlock()
	r.published.Add(uint64(published))
	r.m.published.Add(float64(published))
	r.forgotWM(rejected)
	if len(moved) > 0 {
		r.m.batches.Inc()
	}
	return nil
}

// shardsOf lists the shards of a batch's rows.
func shardsOf(batch []claimed) []int {
	var out []int
	seen := map[int]bool{}
	for i := range batch {
		if s := batch[i].ev.Shard; !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// ErrStateDesign: relays of the status design and of the watermark design
// (WithSentWatermark) would read each other's rows wrongly — a status
// relay republishes every row below a watermark and never publishes a
// 'retry' row — so neither starts beside the other.
var ErrStateDesign = errors.New("relay: the outbox is run by relays of another state design")

// checkStateDesign refuses to start a relay beside relays of the other
// state design, and a status relay once the watermark is in use.
func (r *Relay) checkStateDesign(ctx context.Context) error {
	if r.q.dialect != driver.Postgres {
		return nil
	}
	exec := r.db.Executor()
	var cols int64
	if _, err := driver.QueryRow(ctx, exec, r.q.hasWatermark, nil, &cols); err != nil {
		return fmt.Errorf("relay: inspect lease columns: %w", err)
	}
	if cols == 0 {
		if r.q.watermark {
			return fmt.Errorf("%w: WithSentWatermark needs migration 0012 (run `ferry migrate up`)", ErrStateDesign)
		}
		return nil
	}
	mine := "status"
	if r.q.watermark {
		mine = "watermark"
	}
	var others int64
	if _, err := driver.QueryRow(ctx, exec, r.q.otherState, []any{mine, r.cfg.instance}, &others); err != nil {
		return fmt.Errorf("relay: check live relays' state design: %w", err)
	}
	if others > 0 {
		return fmt.Errorf("%w: %d live relay(s) are not in the %s design; stop them first (every relay of a deployment uses the same design)",
			ErrStateDesign, others, mine)
	}
	if r.q.watermark {
		// Ids must be taken in time order across sessions (the late-commit
		// rule): a cached identity hands each session a block of ids.
		var cache int64
		if _, err := driver.QueryRow(ctx, exec, r.q.idCache, nil, &cache); err != nil {
			return fmt.Errorf("relay: inspect the outbox id sequence: %w", err)
		}
		if cache > 1 {
			return fmt.Errorf("%w: the outbox id sequence caches %d values per session; WithSentWatermark needs CACHE 1 (ALTER TABLE … ALTER COLUMN id SET CACHE 1)",
				ErrStateDesign, cache)
		}
	}
	if !r.q.watermark {
		var inUse bool
		if _, err := driver.QueryRow(ctx, exec, r.q.stateInUse, nil, &inUse); err != nil {
			return fmt.Errorf("relay: check state design: %w", err)
		}
		if inUse {
			return fmt.Errorf("%w: the watermark is in use (relay_leases.sent_up_to > 0 or 'retry' rows); run this relay with WithSentWatermark (`ferry relay --sent-watermark`)",
				ErrStateDesign)
		}
	}
	return nil
}
