package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/internal/logattr"
)

// SQLSTATEs the session branches on.
const (
	sqlstateObjectInUse      = "55006" // slot active for another PID
	sqlstateDuplicateObject  = "42710" // slot or publication already exists
	sqlstateNotInPrereqState = "55000" // slot invalidated, cannot get changes
	sqlstateUndefinedObject  = "42704" // slot does not exist
)

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// txn is one committed outbox transaction from the stream, or a part of
// one: a transaction whose payloads reach a quarter of the budget is
// handed off in parts (partBytes) as it is decoded, so the reader never
// holds a large one whole. Only the last part carries the end LSN.
type txn struct {
	events []ferry.Event
	// created holds each event's created_at on a partitioned outbox (nil
	// otherwise): the marks name the row's partition with it.
	created []time.Time
	// end is the TransactionEndLSN, confirmed once every event of the
	// transaction (every part) is acked and recorded; 0 on a part that
	// is not the last, which confirms nothing.
	end        pglogrepl.LSN
	commitTime time.Time
	bytes      int64 // payload bytes: taken from the session's budget by handOff, given back once acked
}

// outcome of publishing one event.
type outcome struct {
	id      uuid.UUID
	receipt string
	dead    string    // non-empty: permanent failure, sanitised
	created time.Time // the row's created_at (partitioned outbox only)
}

// flushItem is what the flusher records and then confirms.
type flushItem struct {
	outcomes []outcome
	lsn      pglogrepl.LSN
	ntx      int64 // stream transactions covered (for the in-flight count)
}

// session is one hold of the slot: a replication connection plus the
// shipper and flusher goroutines behind it.
type session struct {
	r       *Relay
	pool    *pgxpool.Pool
	tgt     target
	conn    *pgconn.PgConn
	catchUp bool
	// catchUpTo bounds the catch-up to ids <= it (nil: unbounded).
	catchUpTo *int64
	inflight  atomic.Int64 // transactions (or parts of one) handed off and not yet confirmed
	// confirmed is the highest LSN safe to report as flushed.
	confirmed atomic.Uint64
	txCh      chan *txn
	flushCh   chan flushItem
	// budget: payload bytes handed to the shipper and not yet acked
	// (WithMaxPendingBytes).
	budget byteBudget
}

// byteBudget counts the payload bytes of transactions between the WAL
// reader and the broker's ack. take admits a transaction when the bytes
// held leave room for it, or when nothing is held (so one larger than the
// whole budget still ships, alone).
type byteBudget struct {
	limit int64
	mu    sync.Mutex
	held  int64
	freed chan struct{} // a token when give freed bytes
}

func newByteBudget(limit int64) byteBudget {
	return byteBudget{limit: limit, freed: make(chan struct{}, 1)}
}

func (b *byteBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > 0 && b.held > 0 && b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

func (b *byteBudget) give(n int64) {
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// partBytes is the payload size at which the reader hands off what it
// has decoded of a transaction not yet committed in the stream: a quarter
// of the budget, so parts of one transaction pipeline through it. The
// transaction is committed (pgoutput sends only committed ones), so a part
// may be published before the rest is read; its LSN is confirmed only
// with the last part.
func (b *byteBudget) partBytes() int64 { return max(b.limit/4, 1) }

// session holds the slot until an error or ctx ends.
func (r *Relay) session(ctx context.Context, pool *pgxpool.Pool, tgt target) error {
	if err := r.ensurePublication(ctx, pool, tgt); err != nil {
		return err
	}
	create, err := r.prepareSlot(ctx, pool, tgt)
	if err != nil {
		return err
	}
	conn, err := pgconn.ConnectConfig(ctx, r.replCfg)
	if err != nil {
		return fmt.Errorf("cdc: replication connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if create {
		res, err := pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
		if pgCode(err) == sqlstateDuplicateObject {
			return fmt.Errorf("%w: created concurrently by another relay", ErrSlotBusy)
		}
		if err != nil {
			return fmt.Errorf("cdc: create slot %s: %w", r.cfg.slot, err)
		}
		// The exported snapshot sees exactly the transactions committed
		// before the slot's consistent point: the highest outbox id it sees
		// bounds the catch-up, later rows come through the slot. The
		// snapshot lives until this connection runs its next command.
		upto, err := snapshotMaxID(ctx, pool, tgt, res.SnapshotName)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET slot_created_at = now(), catchup_upto = $2 WHERE slot_name = $1`, tgt.slotTable),
			r.cfg.slot, upto); err != nil {
			return fmt.Errorf("cdc: record slot creation: %w", err)
		}
		r.log.InfoContext(ctx, "cdc: replication slot created", "publication", r.cfg.publication, "consistent_point", res.ConsistentPoint, "catchup_upto_id", upto)
	}
	var start pglogrepl.LSN // 0: the server resumes from the slot's confirmed_flush_lsn
	if r.cfg.faults.StartFromCurrentWAL {
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&start); err != nil {
			return fmt.Errorf("cdc: current wal lsn: %w", err)
		}
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.slot, start, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			fmt.Sprintf("publication_names '%s'", r.cfg.publication), // validated identifier
			"messages 'false'",
		},
	})
	switch pgCode(err) {
	case "":
	case sqlstateObjectInUse:
		return fmt.Errorf("%w: %w", ErrSlotBusy, err)
	case sqlstateNotInPrereqState, sqlstateUndefinedObject:
		// Invalidated or dropped between the check and the start: the next
		// session's prepareSlot sees it and recovers.
		return fmt.Errorf("%w: %w", ErrSlotLost, err)
	}
	if err != nil {
		return fmt.Errorf("cdc: start replication: %w", err)
	}
	// We hold the slot now: nobody else can be streaming or catching up.
	s := &session{r: r, pool: pool, tgt: tgt, conn: conn,
		txCh: make(chan *txn, r.cfg.maxPending), flushCh: make(chan flushItem, 64), budget: newByteBudget(r.cfg.pendingBytes)}
	var slotConfirmed pglogrepl.LSN
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT s.confirmed_flush_lsn, coalesce(c.catchup_needed, false), c.catchup_upto
		FROM pg_replication_slots s LEFT JOIN %s c ON c.slot_name = s.slot_name WHERE s.slot_name = $1`, tgt.slotTable),
		r.cfg.slot).Scan(&slotConfirmed, &s.catchUp, &s.catchUpTo); err != nil {
		return fmt.Errorf("cdc: read slot position: %w", err)
	}
	if r.cfg.faults.NoCatchUp {
		s.catchUp = false
	}
	r.setCatchingUp(s.catchUp)
	s.confirmed.Store(uint64(slotConfirmed))
	r.m.confirmed.Set(float64(slotConfirmed))
	r.mu.Lock()
	r.st.ConfirmedLSN = slotConfirmed.String()
	r.mu.Unlock()
	r.setRole(RoleActive)
	r.setError(nil)
	r.log.InfoContext(ctx, "cdc: streaming", "from_lsn", slotConfirmed.String(), "catch_up", s.catchUp)
	return s.run(ctx)
}

// ensurePublication creates the publication on first start (outbox table
// only, inserts only) and otherwise checks it publishes exactly that table.
func (r *Relay) ensurePublication(ctx context.Context, pool *pgxpool.Pool, tgt target) error {
	// A partitioned outbox's rows live in its partitions, including ones
	// created after the publication: published via the root, they all
	// arrive as rows of the outbox (tgt.oid) and the publication needs no
	// change when partitions come and go.
	with := "publish = 'insert'"
	if tgt.partitioned {
		with += ", publish_via_partition_root = true"
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, r.cfg.publication).Scan(&exists); err != nil {
		return fmt.Errorf("cdc: look up publication: %w", err)
	}
	if !exists {
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %q FOR TABLE %s WITH (%s)`, r.cfg.publication, tgt.qualified, with))
		if err != nil && pgCode(err) != sqlstateDuplicateObject {
			return fmt.Errorf("cdc: create publication %s: %w", r.cfg.publication, err)
		}
		if err == nil {
			r.log.InfoContext(ctx, "cdc: publication created", "publication", r.cfg.publication, "table", tgt.qualified)
		}
	}
	var all, insert, ours, viaRoot bool
	var others int
	err := pool.QueryRow(ctx, `SELECT p.puballtables, p.pubinsert, p.pubviaroot,
			EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = $2),
			(SELECT count(*) FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid <> $2)
		FROM pg_publication p WHERE p.pubname = $1`, r.cfg.publication, tgt.oid).Scan(&all, &insert, &viaRoot, &ours, &others)
	if err != nil {
		return fmt.Errorf("cdc: check publication: %w", err)
	}
	if all || !insert || !ours || others > 0 {
		return fmt.Errorf("%w: publication %s must publish inserts of %s and nothing else (all_tables=%v insert=%v includes_outbox=%v other_tables=%d)",
			ErrPublicationMismatch, r.cfg.publication, tgt.qualified, all, insert, ours, others)
	}
	if tgt.partitioned && !viaRoot {
		// Without it pgoutput reports each row under its partition's
		// relation, which is not the outbox: nothing would be published.
		return fmt.Errorf("%w: %s is partitioned, so publication %s must be created WITH (publish_via_partition_root = true) (ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
			ErrPublicationMismatch, tgt.qualified, r.cfg.publication, r.cfg.publication)
	}
	return nil
}

// prepareSlot decides whether the slot must be created, detecting a lost or
// dropped slot on the way. It reports create=true after durably setting the
// catch-up marker, so the pending rows the old slot held (or that predate a
// first slot) are re-published from the table even if the relay crashes
// right after creating the slot.
func (r *Relay) prepareSlot(ctx context.Context, pool *pgxpool.Pool, tgt target) (create bool, err error) {
	var (
		slotExists, active, sameDB bool
		plugin, walStatus          *string
		rowExists                  bool
	)
	err = pool.QueryRow(ctx, `SELECT true, plugin, coalesce(database = current_database(), false), wal_status, active
		FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.slot).Scan(&slotExists, &plugin, &sameDB, &walStatus, &active)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("cdc: look up slot: %w", err)
	}
	if slotExists && (plugin == nil || *plugin != "pgoutput" || !sameDB) {
		return false, fmt.Errorf("%w: slot %s exists but is not a pgoutput slot of this database", ErrPublicationMismatch, r.cfg.slot)
	}
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE slot_name = $1)`, tgt.slotTable), r.cfg.slot).Scan(&rowExists); err != nil {
		return false, fmt.Errorf("cdc: read slot record: %w", err)
	}
	lost := ""
	switch {
	case slotExists && walStatus != nil && *walStatus == "lost":
		if active {
			return false, fmt.Errorf("%w: lost slot still active", ErrSlotBusy)
		}
		lost = "wal_status=lost (WAL removed beyond max_slot_wal_keep_size)"
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, r.cfg.slot); err != nil {
			if pgCode(err) == sqlstateObjectInUse {
				return false, fmt.Errorf("%w: %w", ErrSlotBusy, err)
			}
			return false, fmt.Errorf("cdc: drop lost slot: %w", err)
		}
		slotExists = false
	case !slotExists && rowExists:
		lost = "slot missing although this relay created it before (dropped)"
	}
	if lost != "" {
		r.losses.Add(1)
		r.m.slotLost.Inc()
		r.log.ErrorContext(ctx, "cdc: ALERT replication slot lost; recreating it and re-publishing pending rows from the outbox table",
			"alert", "slot_lost", "reason", lost, logattr.Err(ErrSlotLost))
		// catchup_upto is cleared with the marker: a crash after the new
		// slot is created and before its bound is written must not leave
		// the previous slot's (smaller) bound, which would skip rows.
		if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET catchup_needed = true, catchup_upto = NULL, lost_count = lost_count + 1,
			lost_at = now(), last_error = $2 WHERE slot_name = $1`, tgt.slotTable), r.cfg.slot, lost); err != nil {
			return false, fmt.Errorf("cdc: record slot loss: %w", err)
		}
		return true, nil
	}
	if !slotExists {
		// First start: rows written before the slot existed are only in the table.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot_name, publication, catchup_needed) VALUES ($1, $2, true)
			ON CONFLICT (slot_name) DO UPDATE SET catchup_needed = true, catchup_upto = NULL`, tgt.slotTable), r.cfg.slot, r.cfg.publication)
		if err != nil {
			return false, fmt.Errorf("cdc: record slot: %w", err)
		}
		return true, nil
	}
	if !rowExists {
		// A slot made by hand (or before the table existed): trust it.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot_name, publication, catchup_needed) VALUES ($1, $2, false)
			ON CONFLICT (slot_name) DO NOTHING`, tgt.slotTable), r.cfg.slot, r.cfg.publication)
		if err != nil {
			return false, fmt.Errorf("cdc: record slot: %w", err)
		}
	}
	return false, nil
}

// run drives the pipeline: this goroutine reads the replication stream
// (it alone uses conn), the shipper publishes, the flusher records and
// confirms. The first error stops all three.
func (s *session) run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.ship(ctx); err != nil {
			cancel(err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := s.flush(ctx); err != nil {
			cancel(err)
		}
	}()
	err := s.read(ctx)
	cancel(err)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	// A last status update so a clean stop leaves the slot as far as
	// everything acknowledged and recorded.
	_ = s.sendStatus(false)
	return err
}

// advance raises the confirmed LSN (never lowers it).
func (s *session) advance(lsn pglogrepl.LSN) {
	for {
		cur := s.confirmed.Load()
		if uint64(lsn) <= cur {
			return
		}
		if s.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			if f := s.r.cfg.faults.BeforeConfirm; f != nil {
				f(uint64(lsn))
			}
			s.r.m.confirmed.Set(float64(lsn))
			s.r.mu.Lock()
			s.r.st.ConfirmedLSN = lsn.String()
			s.r.mu.Unlock()
			return
		}
	}
}

func (s *session) sendStatus(reply bool) error {
	lsn := pglogrepl.LSN(s.confirmed.Load())
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ReplyRequested: reply})
	if err != nil {
		return fmt.Errorf("cdc: standby status update: %w", err)
	}
	return nil
}

// read decodes the stream into transactions and answers keepalives.
func (s *session) read(ctx context.Context) error {
	cfg := &s.r.cfg
	rels := map[uint32]*relation{}
	var cur *txn
	var warned bool
	nextStatus := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(true); err != nil {
				return err
			}
			nextStatus = time.Now().Add(cfg.standby)
		}
		rctx, rcancel := context.WithDeadline(ctx, nextStatus)
		raw, err := s.conn.ReceiveMessage(rctx)
		rcancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("cdc: receive: %w", err)
		}
		var data []byte
		switch m := raw.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("cdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("cdc: server ended the replication stream")
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("cdc: keepalive: %w", err)
			}
			// Idle advance: with no outbox transaction open or unconfirmed,
			// everything the server sent before this keepalive is handled, so
			// its WAL position is safe to confirm. This keeps an idle outbox on
			// a busy database from pinning WAL.
			if cur == nil && s.inflight.Load() == 0 && !cfg.faults.NoIdleAdvance {
				s.advance(ka.ServerWALEnd)
			}
			if ka.ReplyRequested {
				if err := s.sendStatus(false); err != nil {
					return err
				}
				nextStatus = time.Now().Add(cfg.standby)
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("cdc: xlogdata: %w", err)
			}
			msg, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrDecode, err)
			}
			switch m := msg.(type) {
			case *pglogrepl.RelationMessage:
				rel := newRelation(m)
				if m.RelationID == s.tgt.oid {
					if err := rel.check(); err != nil {
						return err
					}
				}
				rels[m.RelationID] = rel
			case *pglogrepl.BeginMessage:
				cur = &txn{commitTime: m.CommitTime}
			case *pglogrepl.InsertMessage:
				if m.RelationID != s.tgt.oid {
					if !warned {
						warned = true
						s.r.log.WarnContext(ctx, "cdc: ignoring rows of a table other than the outbox (check the publication)", "relation_id", m.RelationID)
					}
					continue
				}
				rel := rels[m.RelationID]
				if rel == nil || cur == nil {
					return fmt.Errorf("%w: insert before its relation or transaction", ErrDecode)
				}
				ev, err := rel.decodeInsert(m.Tuple)
				if err != nil {
					return err
				}
				cur.events = append(cur.events, ev)
				cur.bytes += int64(len(ev.Payload))
				if s.tgt.partitioned {
					at, err := rel.createdAt(m.Tuple)
					if err != nil {
						return err
					}
					cur.created = append(cur.created, at)
				}
				if cur.bytes >= s.budget.partBytes() {
					part := cur
					cur = &txn{commitTime: part.commitTime}
					if err := s.handOff(ctx, part); err != nil {
						return err
					}
				}
			case *pglogrepl.CommitMessage:
				if cur == nil {
					return fmt.Errorf("%w: commit without begin", ErrDecode)
				}
				cur.end = m.TransactionEndLSN
				t := cur
				cur = nil
				if err := s.handOff(ctx, t); err != nil {
					return err
				}
			default:
				// Origin, Type, Truncate, Update, Delete: not published (the
				// publication is insert-only) or irrelevant.
			}
		}
	}
}

// handOff passes a committed transaction to the shipper. Back-pressure:
// while the shipper is behind (broker down), the reader stops reading but
// keeps sending status updates, so the server does not time the session out.
func (s *session) handOff(ctx context.Context, t *txn) error {
	if len(t.events) == 0 && s.inflight.Load() == 0 {
		s.advance(t.end)
		return nil
	}
	s.inflight.Add(1)
	if s.r.cfg.faults.ConfirmBeforeAck {
		s.advance(t.end)
	}
	n := t.bytes
	taken := s.budget.take(n)
	if taken {
		select {
		case s.txCh <- t:
			return nil
		default:
		}
	}
	tick := time.NewTicker(s.r.cfg.standby)
	defer tick.Stop()
	for {
		if !taken {
			taken = s.budget.take(n)
		}
		var send chan<- *txn
		if taken {
			send = s.txCh
		}
		select {
		case send <- t:
			return nil
		case <-s.budget.freed:
		case <-tick.C:
			if err := s.sendStatus(false); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ship publishes transactions in commit order, batching whatever has
// queued up while the previous batch was in flight.
func (s *session) ship(ctx context.Context) error {
	if s.catchUp {
		if err := s.runCatchUp(ctx); err != nil {
			return err
		}
	}
	var batch []*txn
	var events []ferry.Event
	var created []time.Time
	var rec reconcileState
	var tick <-chan time.Time
	if !s.r.cfg.faults.NoReconcile {
		t := time.NewTicker(s.r.cfg.reconcile)
		defer t.Stop()
		tick = t.C
	}
	for {
		batch, events, created = batch[:0], events[:0], created[:0]
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			if err := s.reconcile(ctx, &rec); err != nil {
				return err
			}
			continue
		case t := <-s.txCh:
			batch = append(batch, t)
			events, created = append(events, t.events...), append(created, t.created...)
		}
	drain:
		for len(events) < s.r.cfg.maxBatch {
			select {
			case t := <-s.txCh:
				batch = append(batch, t)
				events, created = append(events, t.events...), append(created, t.created...)
			default:
				break drain
			}
		}
		outs, err := s.publishAll(ctx, events, created)
		if err != nil {
			return err
		}
		// Acked (or dead): the payloads are no longer needed.
		clear(events)
		now := time.Now()
		var acked int64
		for _, t := range batch {
			acked += t.bytes
			if len(t.events) > 0 {
				s.r.m.ackLatency.Observe(now.Sub(t.commitTime).Seconds())
			}
		}
		s.budget.give(acked)
		item := flushItem{outcomes: outs, ntx: int64(len(batch))}
		for _, t := range batch {
			item.lsn = max(item.lsn, t.end) // a part of a transaction confirms nothing
		}
		clear(batch)
		if s.r.cfg.faults.ConfirmBeforeMark {
			s.advance(item.lsn) // the broken order: confirmed before the rows say sent
		}
		select {
		case s.flushCh <- item:
		case <-ctx.Done():
			return nil
		}
	}
}

// publishAll publishes events until every one is acknowledged or
// permanently refused. Transient failures are retried, in order, with
// bounded backoff; while the broker does not answer Ping no attempt is
// spent. It returns only on success or when ctx ends. created, when not
// nil, holds each event's created_at (partitioned outbox), carried into its
// outcome.
func (s *session) publishAll(ctx context.Context, events []ferry.Event, created []time.Time) ([]outcome, error) {
	outs := make([]outcome, len(events))
	todo := make([]int, len(events))
	for i := range events {
		outs[i].id = events[i].ID
		if i < len(created) {
			outs[i].created = created[i]
		}
		todo[i] = i
	}
	b := backoff{min: s.r.cfg.backoffMin, max: s.r.cfg.backoffMax}
	var chunk []ferry.Event
	for len(todo) > 0 {
		var retry []int
		for start := 0; start < len(todo); start += s.r.cfg.maxBatch {
			idx := todo[start:min(start+s.r.cfg.maxBatch, len(todo))]
			chunk = chunk[:0]
			for _, i := range idx {
				chunk = append(chunk, events[i])
			}
			res := s.r.pub.Publish(ctx, chunk)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			for k, i := range idx {
				var rs broker.Result
				if k < len(res) {
					rs = res[k]
				} else {
					rs.Err = broker.NewError(broker.ClassIndeterminate, errors.New("publisher returned fewer results than events"))
				}
				switch {
				case rs.Err == nil:
					outs[i].receipt = rs.Receipt.String()
				case broker.ClassOf(rs.Err) == broker.ClassPermanent:
					outs[i].dead = truncate(rs.Err.Error(), 500)
					s.r.dead.Add(1)
					s.r.m.dead.Inc()
					s.r.log.ErrorContext(ctx, "cdc: ALERT event permanently refused by the broker; row marked dead",
						"alert", "dead_event", "event_id", events[i].ID, "event_type", events[i].EventType,
						"aggregate_type", events[i].AggregateType, "aggregate_id", events[i].AggregateID, logattr.Err(rs.Err))
				default:
					retry = append(retry, i)
				}
			}
		}
		if len(retry) == 0 {
			break
		}
		todo = retry
		s.r.retries.Add(int64(len(retry)))
		s.r.m.retries.Add(float64(len(retry)))
		d := b.next()
		s.r.log.WarnContext(ctx, "cdc: broker publish failed, retrying", "events", len(retry), "first_event_id", events[retry[0]].ID, "retry_in", d)
		if !sleep(ctx, d) {
			return nil, ctx.Err()
		}
		// Wait for the broker to answer before spending another attempt:
		// one probe per backoff period, never a retry storm.
		for {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.r.pub.Ping(pctx)
			pcancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !sleep(ctx, b.next()) {
				return nil, ctx.Err()
			}
		}
	}
	var n int64
	for _, o := range outs {
		if o.dead == "" {
			n++
		}
	}
	s.r.published.Add(n)
	s.r.m.published.Add(float64(n))
	return outs, nil
}

// flush records outcomes in the table in batches, then confirms the LSN.
// The order matters: the table is what slot-loss recovery re-publishes
// from, so a transaction is confirmed to Postgres only after its rows say
// sent (or dead). A crash between the two costs duplicates, never a loss.
func (s *session) flush(ctx context.Context) error {
	var items []flushItem
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case it := <-s.flushCh:
			items = append(items, it)
			if !armed {
				timer.Reset(s.r.cfg.flushInterval)
				armed = true
			}
			continue
		case <-timer.C:
			armed = false
		}
		// Gather anything else already waiting.
	more:
		for {
			select {
			case it := <-s.flushCh:
				items = append(items, it)
			default:
				break more
			}
		}
		var outs []outcome
		var ntx int64
		var lsn pglogrepl.LSN
		for _, it := range items {
			outs = append(outs, it.outcomes...)
			ntx += it.ntx
			lsn = max(lsn, it.lsn)
		}
		if err := s.record(ctx, outs); err != nil {
			return err
		}
		s.advance(lsn)
		s.inflight.Add(-ntx)
		items = items[:0]
	}
}

// record writes outcomes: sent rows get published_at and the receipt, dead
// rows last_error. Rows another relay already marked are left alone. It
// retries database errors with backoff until ctx ends.
//
// Postgres writes a transaction's commit record to the WAL, and the
// walsender may decode and send it, before the transaction is visible to
// other sessions (the committing backend leaves the proc array a moment
// later; under CPU pressure or with synchronous replication, much later).
// A row published that fast can be missing from the marking UPDATE's
// snapshot: the UPDATE then finds nothing, and confirming the LSN anyway
// would leave a published row 'pending' for ever (issue #23). So record
// also returns the ids its statement could not see at all, and waits for
// them (bounded by visibleWait) before the caller confirms; whatever is
// still invisible after that is left to the reconciler.
func (s *session) record(ctx context.Context, outs []outcome) error {
	wait := time.Millisecond
	deadline := time.Now().Add(s.r.cfg.visibleWait)
	for len(outs) > 0 {
		missing, err := s.recordOnce(ctx, outs)
		if err != nil {
			return err
		}
		if len(missing) == 0 || s.r.cfg.faults.NoVisibilityWait {
			return nil
		}
		if time.Now().After(deadline) {
			s.r.log.WarnContext(ctx, "cdc: rows decoded from the WAL are still not visible in the outbox table; leaving them pending for the reconciler "+
				"(is this relay listed in synchronous_standby_names?)", "rows", len(missing), "first_event_id", missing[0].id, "waited", s.r.cfg.visibleWait)
			return nil
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, 100*time.Millisecond)
		outs = missing
	}
	return nil
}

// recordOnce runs the marking statement once and returns the outcomes
// whose rows its snapshot did not contain (not yet visible).
func (s *session) recordOnce(ctx context.Context, outs []outcome) ([]outcome, error) {
	var sentIDs, receipts, deadIDs, deadErrs []string
	var sentAt, deadAt []time.Time
	for _, o := range outs {
		if o.dead != "" {
			deadIDs, deadErrs, deadAt = append(deadIDs, o.id.String()), append(deadErrs, o.dead), append(deadAt, o.created)
		} else {
			sentIDs, receipts, sentAt = append(sentIDs, o.id.String()), append(receipts, o.receipt), append(sentAt, o.created)
		}
	}
	args := []any{sentIDs, receipts, deadIDs, deadErrs}
	if s.tgt.partitioned {
		args = append(args, sentAt, deadAt)
	}
	q := recordSQL(s.tgt)
	b := backoff{min: s.r.cfg.backoffMin, max: s.r.cfg.backoffMax}
	for {
		var invisible []string
		err := s.pool.QueryRow(ctx, q, args...).Scan(&invisible)
		if err == nil {
			if len(invisible) == 0 {
				return nil, nil
			}
			miss := make(map[string]bool, len(invisible))
			for _, id := range invisible {
				miss[id] = true
			}
			var out []outcome
			for _, o := range outs {
				if miss[o.id.String()] {
					out = append(out, o)
				}
			}
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait := b.next()
		s.r.log.WarnContext(ctx, "cdc: recording publication failed, retrying (the slot does not advance meanwhile)", logattr.Err(err), "retry_in", wait)
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// recordSQL is recordOnce's statement: $1 sent event ids, $2 their
// receipts, $3 dead event ids, $4 their errors and, on a partitioned
// outbox, $5 and $6 the created_at of the sent and the dead rows.
func recordSQL(tgt target) string {
	// On a partitioned outbox every row is looked up by (event_id,
	// created_at), the partition key included, so each lookup is pruned
	// at run time to the row's own partition instead of probing every
	// partition's index (measured: 3 instead of 17 buffers per row with
	// 15 partitions).
	sentBy, deadBy, visBy := "r(event_id, receipt)", "r(event_id, err)", "x(event_id)"
	sentArr, deadArr, visArr := "$1::uuid[], $2::text[]", "$3::uuid[], $4::text[]", "array_cat($1::uuid[], $3::uuid[])"
	sentOn, deadOn, visOn := "o.event_id = r.event_id", "o.event_id = r.event_id", "o.event_id = x.event_id"
	if tgt.partitioned {
		sentBy, deadBy, visBy = "r(event_id, receipt, created_at)", "r(event_id, err, created_at)", "x(event_id, created_at)"
		sentArr, deadArr = sentArr+", $5::timestamptz[]", deadArr+", $6::timestamptz[]"
		visArr = "array_cat($1::uuid[], $3::uuid[]), array_cat($5::timestamptz[], $6::timestamptz[])"
		sentOn, deadOn, visOn = sentOn+" AND o.created_at = r.created_at", deadOn+" AND o.created_at = r.created_at",
			visOn+" AND o.created_at = x.created_at"
	}
	// Data-modifying CTEs run to completion whether or not the main query
	// reads them; the main query sees the statement's snapshot, so a row
	// absent there is one this UPDATE could not have marked.
	return fmt.Sprintf(`WITH sent AS (
    UPDATE %[1]s o SET status = 'sent', published_at = now(), broker_receipt = r.receipt, attempts = o.attempts + 1
    FROM unnest(%[2]s) AS %[3]s
    WHERE %[4]s AND o.status = 'pending'
    RETURNING 1
), dead AS (
    UPDATE %[1]s o SET status = 'dead', last_error = r.err, attempts = o.attempts + 1
    FROM unnest(%[5]s) AS %[6]s
    WHERE %[7]s AND o.status = 'pending'
    RETURNING 1
)
SELECT coalesce(array_agg(x.event_id::text), '{}') FROM unnest(%[8]s) AS %[9]s
WHERE NOT EXISTS (SELECT 1 FROM %[1]s o WHERE %[10]s)`, tgt.qualified, sentArr, sentBy, sentOn, deadArr, deadBy, deadOn, visArr, visBy, visOn)
}

// reconcileState is the reconciler's note between two ticks: the oldest
// pending rows seen and the WAL insert position right after that snapshot
// (every one of them committed before it).
type reconcileState struct {
	w      pglogrepl.LSN
	ids    []int64
	armed  bool
	nudged bool
}

// reconcile repairs rows left 'pending' behind the slot. At one tick it
// notes the oldest pending rows and W, the WAL insert position evaluated
// after the statement's snapshot, so each noted row committed before W. At
// a later tick, once this session has confirmed a position >= W, each of
// those rows' transactions went through publish and record; a row still
// pending was published but not marked (a crash between the broker's ack
// and a mark of an older build, a row not yet visible when it was marked,
// a lost catch-up) and the slot will never send it again. It is
// re-published — the broker's dedup absorbs the copy and answers with the
// original receipt — and marked. Rows still ahead of the slot (a backlog
// in flight) are never touched, so an outage causes no republishing storm.
func (s *session) reconcile(ctx context.Context, st *reconcileState) error {
	if st.armed {
		if pglogrepl.LSN(s.confirmed.Load()) < st.w {
			if !st.nudged {
				// On an idle database nothing may move WAL past W: a
				// non-transactional logical message does (never published:
				// the stream runs with messages=false).
				st.nudged = true
				if _, err := s.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'ferry.reconcile', '')`); err != nil && ctx.Err() == nil {
					s.r.log.DebugContext(ctx, "cdc: reconcile nudge failed", logattr.Err(err))
				}
			}
			return nil
		}
		st.armed = false
		q := fmt.Sprintf(`SELECT %s FROM %s WHERE status = 'pending' AND id = ANY($1) ORDER BY id`, pendingCols, s.tgt.qualified)
		events, created, _, err := s.pendingEvents(ctx, q, st.ids)
		if err != nil {
			return err
		}
		if len(events) > 0 {
			s.r.log.WarnContext(ctx, "cdc: rows pending behind the slot's confirmed position; re-publishing them (broker dedup returns the original receipt) and marking them",
				"rows", len(events), "first_event_id", events[0].ID, "confirmed_lsn", pglogrepl.LSN(s.confirmed.Load()).String(), "behind", st.w.String())
			outs, err := s.publishAll(ctx, events, created)
			if err != nil {
				return err
			}
			if err := s.record(ctx, outs); err != nil {
				return err
			}
			s.r.reconciled.Add(int64(len(events)))
			s.r.m.reconciled.Add(float64(len(events)))
		}
	}
	q := fmt.Sprintf(`SELECT pg_current_wal_insert_lsn(), coalesce(array(SELECT id FROM %s WHERE status = 'pending' ORDER BY id LIMIT $1), '{}')`, s.tgt.qualified)
	if err := s.pool.QueryRow(ctx, q, s.r.cfg.maxBatch).Scan(&st.w, &st.ids); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.r.log.WarnContext(ctx, "cdc: reconcile snapshot failed, retrying next interval", logattr.Err(err))
		return nil
	}
	st.armed, st.nudged = len(st.ids) > 0, false
	return nil
}

// runCatchUp re-publishes pending rows from the table after the slot was
// created or recreated, in id order (per aggregate that is sequence order:
// the producer's row lock serialises an aggregate's inserts), records them,
// and only then clears the durable marker.
func (s *session) runCatchUp(ctx context.Context) error {
	s.r.log.InfoContext(ctx, "cdc: catching up pending rows from the outbox table")
	q := fmt.Sprintf(`SELECT %s FROM %s WHERE status = 'pending' AND id > $1 AND ($3::bigint IS NULL OR id <= $3)
		ORDER BY id LIMIT $2`, pendingCols, s.tgt.qualified)
	var last, total int64
	for {
		events, created, maxID, err := s.pendingEvents(ctx, q, last, s.r.cfg.maxBatch, s.catchUpTo)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			break
		}
		last = maxID
		outs, err := s.publishAll(ctx, events, created)
		if err != nil {
			return err
		}
		if err := s.record(ctx, outs); err != nil {
			return err
		}
		total += int64(len(events))
		s.r.m.catchUp.Add(float64(len(events)))
	}
	if _, err := s.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET catchup_needed = false WHERE slot_name = $1`, s.tgt.slotTable), s.r.cfg.slot); err != nil {
		return fmt.Errorf("cdc: clear catch-up marker: %w", err)
	}
	s.r.setCatchingUp(false)
	s.r.log.InfoContext(ctx, "cdc: catch-up done", "events", total)
	return nil
}

// pendingCols are the outbox columns pendingEvents scans, id first.
const pendingCols = `id, event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
		topic, shard, content_type, payload, occurred_at, traceparent, correlation_id, causation_id, principal, action, target, created_at`

// pendingEvents runs q (selecting pendingCols, ORDER BY id) and returns
// the events, their created_at on a partitioned outbox (nil otherwise) and
// the highest outbox id kept. It keeps an id-ordered prefix of the rows
// within the WithMaxPendingBytes budget (the first row always): the
// callers go on from the last id kept, or find the rest pending at their
// next round.
func (s *session) pendingEvents(ctx context.Context, q string, args ...any) ([]ferry.Event, []time.Time, int64, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("cdc: read pending rows: %w", err)
	}
	defer rows.Close()
	var events []ferry.Event
	var created []time.Time
	var last, bytes int64
	for rows.Next() {
		var e ferry.Event
		var sv, shard int32
		var id int64
		var at time.Time
		if err := rows.Scan(&id, &e.ID, &e.TenantID, &e.AggregateType, &e.AggregateID, &e.AggregateSeq, &e.EventType, &sv,
			&e.Topic, &shard, &e.ContentType, &e.Payload, &e.OccurredAt, &e.Headers.Traceparent, &e.Headers.CorrelationID,
			&e.Headers.CausationID, &e.Headers.Principal, &e.Headers.Action, &e.Headers.Target, &at); err != nil {
			return nil, nil, 0, fmt.Errorf("cdc: scan pending row: %w", err)
		}
		if bytes += int64(len(e.Payload)); len(events) > 0 && bytes > s.r.cfg.pendingBytes {
			break
		}
		e.SchemaVersion, e.Shard = int(sv), int(shard)
		e.OccurredAt = e.OccurredAt.UTC()
		events = append(events, e)
		if s.tgt.partitioned {
			created = append(created, at)
		}
		last = max(last, id)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("cdc: read pending rows: %w", err)
	}
	return events, created, last, nil
}

// snapshotMaxID returns the highest outbox id visible in the exported
// snapshot (0 when the table is empty).
func snapshotMaxID(ctx context.Context, pool *pgxpool.Pool, tgt target, snapshot string) (int64, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("cdc: snapshot tx: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The snapshot name comes from the server (hex and dashes), never from input.
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET TRANSACTION SNAPSHOT '%s'`, strings.ReplaceAll(snapshot, "'", ""))); err != nil {
		return 0, fmt.Errorf("cdc: import slot snapshot: %w", err)
	}
	var upto int64
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(id), 0) FROM %s`, tgt.qualified)).Scan(&upto); err != nil {
		return 0, fmt.Errorf("cdc: max id in slot snapshot: %w", err)
	}
	return upto, tx.Commit(ctx)
}

func (r *Relay) setCatchingUp(v bool) {
	r.mu.Lock()
	r.st.CatchingUp = v
	r.mu.Unlock()
}
