package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/sanitize"
)

// The bulk pass is the optimistic pass of a batch on Postgres. Instead of
// one claim statement per message it sends two per batch: a read that
// returns the known claims of the batch's event ids and locks the cursors
// of its aggregates (in key order, so concurrent batches cannot deadlock),
// then — after the decisions were taken in Go with the same decide
// function SQLite uses, message by message in broker order — one write of
// every claim and every cursor's final value, which also reports which
// aggregates have a parked successor waiting. The handlers then run in
// order. Anything unusual (a lost race, a handler error, a denial) returns
// errNeedSavepoints: nothing is committed and the batch is re-run through
// the per-message path with savepoints.

func bulkReadSQL(inbox, cursor string) string {
	return fmt.Sprintf(`WITH cur AS (
    SELECT c.tenant_id, c.aggregate_type, c.aggregate_id, c.last_seq
    FROM %[2]s c
    JOIN (SELECT DISTINCT * FROM unnest($4::text[], $5::text[], $6::text[]) AS a(tenant_id, aggregate_type, aggregate_id)) a
      ON c.tenant_id = a.tenant_id AND c.aggregate_type = a.aggregate_type AND c.aggregate_id = a.aggregate_id
    WHERE c.consumer = $1 AND $7::bool
    ORDER BY c.tenant_id, c.aggregate_type, c.aggregate_id
    FOR UPDATE OF c
), prev AS (
    SELECT b.tenant_id, b.event_id::text AS event_id, b.fingerprint
    FROM %[1]s b
    JOIN unnest($2::text[], $3::uuid[]) AS i(tenant_id, event_id) ON b.tenant_id = i.tenant_id AND b.event_id = i.event_id
    WHERE b.consumer = $1
)
SELECT 'c', tenant_id, aggregate_type, aggregate_id, last_seq, '\x'::bytea FROM cur
UNION ALL
SELECT 'i', tenant_id, event_id, '', 0, fingerprint FROM prev`, inbox, cursor)
}

func bulkWriteSQL(inbox, cursor, parked string) string {
	return fmt.Sprintf(`WITH claims AS (
    INSERT INTO %[1]s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
    SELECT $1, t, e, f, at, ai, s, et, $9::timestamptz
    FROM unnest($2::text[], $3::uuid[], $4::bytea[], $5::text[], $6::text[], $7::bigint[], $8::text[]) AS u(t, e, f, at, ai, s, et)
    ON CONFLICT DO NOTHING
    RETURNING 1
), moved AS (
    UPDATE %[2]s c SET last_seq = u.s, updated_at = $9::timestamptz
    FROM unnest($10::text[], $11::text[], $12::text[], $13::bigint[], $14::bigint[]) AS u(t, at, ai, s, was)
    WHERE c.consumer = $1 AND c.tenant_id = u.t AND c.aggregate_type = u.at AND c.aggregate_id = u.ai
      AND u.was >= 0 AND c.last_seq = u.was
    RETURNING 1
), created AS (
    INSERT INTO %[2]s (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
    SELECT $1, t, at, ai, s, $9::timestamptz
    FROM unnest($10::text[], $11::text[], $12::text[], $13::bigint[], $14::bigint[]) AS u(t, at, ai, s, was)
    WHERE u.was < 0
    ON CONFLICT DO NOTHING
    RETURNING 1
), succ AS (
    SELECT u.t, u.at, u.ai, u.s
    FROM unnest($10::text[], $11::text[], $12::text[], $13::bigint[]) AS u(t, at, ai, s)
    WHERE EXISTS (SELECT 1 FROM %[3]s p WHERE p.consumer = $1 AND p.tenant_id = u.t AND p.aggregate_type = u.at
        AND p.aggregate_id = u.ai AND p.reason = 'gap' AND p.resolved_at IS NULL AND p.aggregate_seq = u.s + 1)
)
SELECT 'n', '', '', '', (SELECT count(*) FROM claims), (SELECT count(*) FROM moved) + (SELECT count(*) FROM created)
UNION ALL
SELECT 's', t, at, ai, s, 0 FROM succ`, inbox, cursor, parked)
}

type claimKey struct{ tenant, eventID string }

func (ib *Inbox[TTx]) bulkPass(ctx context.Context, txv TTx, tx driver.Tx, msgs []*message, tally *txTally) error {
	// Park what cannot even be claimed: undecodable, unsupported schema.
	var live []*message
	var tenants, eventIDs, aTenants, aTypes, aIDs []string
	for _, m := range msgs {
		if m.invalid != nil {
			if err := ib.parkLive(ctx, tx, m, ReasonUndecodable, m.invalid.Error(), nil); err != nil {
				return err
			}
			continue
		}
		if ib.cfg.schemas != nil && !ib.cfg.schemas[SchemaKey{m.ev.EventType, m.ev.SchemaVersion}] {
			err := fmt.Errorf("event type %q schema version %d is not supported by this consumer", sanitize.Text(m.ev.EventType, 128), m.ev.SchemaVersion)
			if err := ib.parkLive(ctx, tx, m, ReasonSchema, err.Error(), nil); err != nil {
				return err
			}
			continue
		}
		if err := ib.contractErr(m.ev); err != nil {
			if err := ib.parkLive(ctx, tx, m, ReasonSchema, err.Error(), nil); err != nil {
				return err
			}
			continue
		}
		live = append(live, m)
		tenants, eventIDs = append(tenants, m.ev.TenantID), append(eventIDs, m.ev.ID.String())
		aTenants, aTypes, aIDs = append(aTenants, m.ev.TenantID), append(aTypes, m.ev.AggregateType), append(aIDs, m.ev.AggregateID)
	}
	if len(live) == 0 {
		return nil
	}

	// Read: known claims and locked cursors.
	prev := map[claimKey][]byte{}
	cursor := map[aggRef]int64{}
	rows, err := tx.Query(ctx, ib.q.bulkRead, ib.name, tenants, eventIDs, aTenants, aTypes, aIDs, ib.cfg.ordering)
	if err != nil {
		return fmt.Errorf("inbox: bulk read: %w", err)
	}
	for rows.Next() {
		var kind, a, b, c string
		var seq int64
		var fp []byte
		if err := rows.Scan(&kind, &a, &b, &c, &seq, &fp); err != nil {
			rows.Close()
			return fmt.Errorf("inbox: bulk read: %w", err)
		}
		if kind == "c" {
			cursor[aggRef{a, b, c}] = seq
		} else {
			prev[claimKey{a, b}] = fp
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: bulk read: %w", err)
	}

	// Decide, in broker order, on an overlay of what this batch claims.
	initial := make(map[aggRef]int64, len(cursor))
	for k, v := range cursor {
		initial[k] = v
	}
	var claimed []*message
	anyStart := ib.cfg.start == StartAtFirstSeen
	for _, m := range live {
		ev := &m.ev
		ck := claimKey{ev.TenantID, ev.ID.String()}
		ak := aggRef{ev.TenantID, ev.AggregateType, ev.AggregateID}
		pfp, hasPrev := prev[ck]
		last, known := cursor[ak]
		if !known {
			last = -1
		}
		switch decide(hasPrev, pfp, m.fp[:], ib.cfg.ordering, anyStart, last, ev.AggregateSeq) {
		case "duplicate":
			m.outcome = OutcomeDuplicate
		case "stale":
			m.outcome = OutcomeStale
		case "collision":
			if err := ib.finishStep(ctx, txv, tx, m, stepResult{kind: stepCollision, prevFP: pfp}, tally); err != nil {
				return err
			}
		case "gap":
			gapErr := gapError(last, ev.AggregateSeq)
			if err := ib.parkLive(ctx, tx, m, ReasonGap, gapErr.Error(), nil); err != nil {
				return err
			}
		case "apply":
			claimed = append(claimed, m)
			prev[ck] = m.fp[:]
			if ib.cfg.ordering {
				cursor[ak] = ev.AggregateSeq
			}
		}
	}
	if len(claimed) == 0 {
		return nil
	}

	// Write every claim and every moved cursor in one statement.
	n := len(claimed)
	var (
		cT, cE, cAT, cAI, cET = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		cF                    = make([][]byte, n)
		cS                    = make([]int64, n)
		uT, uAT, uAI          []string
		uS, uWas              []int64
	)
	moved := map[aggRef]bool{}
	for i, m := range claimed {
		ev := &m.ev
		cT[i], cE[i], cF[i], cAT[i], cAI[i], cS[i], cET[i] = ev.TenantID, ev.ID.String(), m.fp[:], ev.AggregateType, ev.AggregateID, ev.AggregateSeq, ev.EventType
		ak := aggRef{ev.TenantID, ev.AggregateType, ev.AggregateID}
		if ib.cfg.ordering && !moved[ak] {
			moved[ak] = true
			was, ok := initial[ak]
			if !ok {
				was = -1
			}
			uT, uAT, uAI, uS, uWas = append(uT, ak.tenant), append(uAT, ak.typ), append(uAI, ak.id), append(uS, cursor[ak]), append(uWas, was)
		}
	}
	now := ib.cfg.now().UTC()
	rows, err = tx.Query(ctx, ib.q.bulkWrite, ib.name, cT, cE, cF, cAT, cAI, cS, cET, now, uT, uAT, uAI, uS, uWas)
	if err != nil {
		return fmt.Errorf("inbox: bulk claim: %w", err)
	}
	var nClaims, nCursors int64
	var successors []aggRef
	succSeq := map[aggRef]int64{}
	for rows.Next() {
		var kind, a, b, c string
		var x, y int64
		if err := rows.Scan(&kind, &a, &b, &c, &x, &y); err != nil {
			rows.Close()
			return fmt.Errorf("inbox: bulk claim: %w", err)
		}
		if kind == "n" {
			nClaims, nCursors = x, y
		} else {
			k := aggRef{a, b, c}
			successors = append(successors, k)
			succSeq[k] = x
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: bulk claim: %w", err)
	}
	if nClaims != int64(n) || nCursors != int64(len(uT)) {
		return errNeedSavepoints // another instance claimed or moved a cursor meanwhile
	}

	// Authorize and apply, in order.
	for _, m := range claimed {
		if ib.authorize != nil {
			if err := ib.authorize(ctx, txv, m.ev); err != nil {
				return errNeedSavepoints
			}
		}
		start := time.Now()
		err := ib.handler(ctx, txv, m.ev)
		ib.m.handlerSeconds.Observe(time.Since(start).Seconds())
		if err != nil {
			return errNeedSavepoints
		}
		m.outcome = OutcomeApplied
	}
	for _, k := range successors {
		last := claimed[0].ev // any event of the aggregate carries the keys; the sequence is the final cursor
		last.TenantID, last.AggregateType, last.AggregateID, last.AggregateSeq = k.tenant, k.typ, k.id, succSeq[k]
		if err := ib.applySuccessors(ctx, txv, tx, last, tally); err != nil {
			return err
		}
	}
	return nil
}

type aggRef struct{ tenant, typ, id string }
