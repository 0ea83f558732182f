package prove

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
)

const consumerName = "orders-projection"

// refInbox is prove's reference consumer: inbox claim, cursor check,
// schema and authorization re-check, the business effect and the ledger
// row all in one transaction, acked only after commit. Gaps park and heal
// when the missing event arrives; poison parks after maxAttempts.
type refInbox struct {
	env         *env
	maxAttempts int
	durable     string // broker subscription; "prove" unless replaying

	// Broken variants (negative controls).
	nonAtomic       bool // claim commits in one transaction, the effect in another
	inlineEffect    bool // calls the provider inside the handler, no ledger
	ackBeforeCommit bool // acks on receipt, before the claim + effect transaction commits
}

// ackBeforeCommitWork is the rest of the ack-before-commit control's
// transaction (control-inbox-ack-before-commit-db-crash): the work between
// its early ack and its COMMIT, in which a database crash leaves a message
// the broker will not redeliver and the database never recorded.
const ackBeforeCommitWork = 10 * time.Millisecond

var errPoison = errors.New("prove: handler rejected the payload")

func (c *refInbox) run(ctx context.Context) error {
	durable := c.durable
	if durable == "" {
		durable = "prove"
	}
	cons, err := c.env.newConsumer(ctx, durable)
	if err != nil {
		return err
	}
	defer cons.Close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var crashed error
	err = cons.Consume(cctx, func(ctx context.Context, d *broker.Delivery) {
		if crashed != nil {
			return
		}
		if err := c.handle(ctx, d); err != nil {
			if errors.Is(err, errCrash) {
				crashed = err
				cancel() // dead: nothing more is handled or acked
				return
			}
			if ctx.Err() == nil {
				c.env.rec.err(err)
			}
		}
	})
	if crashed != nil {
		return crashed
	}
	return err
}

func fingerprint(d *broker.Delivery) string {
	h := sha256.New()
	e := d.Event
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%s\x00%d\x00", e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq, e.EventType, e.SchemaVersion)
	h.Write(e.Payload)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func (c *refInbox) handle(ctx context.Context, d *broker.Delivery) error {
	id := d.Raw.Headers["Nats-Msg-Id"]
	if d.DecodeErr == nil {
		id = d.Event.ID.String()
	}
	c.env.rec.mu.Lock()
	c.env.rec.deliveries[id]++
	c.env.rec.mu.Unlock()
	if d.DecodeErr != nil {
		c.env.rec.err(d.DecodeErr)
		if err := c.park(ctx, c.env.db.drv.Executor(), id, "undecodable", d, 0); err != nil {
			return err
		}
		return d.Ack(ctx)
	}
	if c.env.fire(faultReorder, id) {
		// Hold this one back: later events of its aggregate arrive first.
		return d.Nack(ctx, 300*time.Millisecond)
	}
	if c.nonAtomic {
		return c.handleNonAtomic(ctx, d)
	}
	if c.ackBeforeCommit {
		// The broken consumer: the broker is told the message is done on
		// receipt (auto-ack), before the transaction below commits. Later
		// acks and nacks of this delivery are no-ops: it is settled.
		if err := d.Ack(ctx); err != nil {
			return fmt.Errorf("inbox: early ack: %w", err)
		}
		c.env.earlyAcked.Add(1)
		defer c.env.earlyAcked.Add(-1)
		early := *d
		early.Ack = func(context.Context) error { return nil }
		early.Nack = func(context.Context, time.Duration) error { return nil }
		d = &early
	}
	tx, err := c.env.db.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	fp := fingerprint(d)
	n, err := tx.Exec(ctx, sqlFor(tx.Dialect(), `INSERT INTO prove_inbox (consumer, event_id, fingerprint, claimed_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`),
		consumerName, id, fp, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("inbox: claim: %w", err)
	}
	if n == 0 {
		old, err := queryString(ctx, tx, `SELECT fingerprint FROM prove_inbox WHERE consumer = $1 AND event_id = $2`, consumerName, id)
		if err != nil {
			return err
		}
		if old != fp {
			// Same id, different content: park the newcomer, keep the original.
			if err := c.park(ctx, tx, id+"#"+fp, "collision", d, 0); err != nil {
				return err
			}
			c.env.log.WarnContext(ctx, "prove: event id collision parked", slog.String("event_id", id), slog.String("tenant", d.Event.TenantID))
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("inbox: commit: %w", err)
		}
		return d.Ack(ctx) // duplicate absorbed
	}
	if reason, err := c.check(ctx, tx, d); err != nil {
		return err
	} else if reason != "" {
		if err := c.park(ctx, tx, id, reason, d, 0); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("inbox: commit: %w", err)
		}
		return d.Ack(ctx)
	}
	if bytes.Contains(d.Event.Payload, []byte(`"poison":true`)) {
		_ = tx.Rollback(ctx)
		if d.Attempt >= c.maxAttempts {
			if err := c.park(ctx, c.env.db.drv.Executor(), id, "poison", d, d.Attempt); err != nil {
				return err
			}
			c.env.log.WarnContext(ctx, "prove: poison message parked", slog.String("event_id", id), slog.Int("attempts", d.Attempt))
			return d.Ack(ctx)
		}
		c.env.rec.err(fmt.Errorf("inbox: event %s: %w", id, errPoison))
		return d.Nack(ctx, 20*time.Millisecond)
	}
	last, err := c.cursor(ctx, tx, d.Event)
	if err != nil {
		return err
	}
	switch seq := d.Event.AggregateSeq; {
	case seq <= last:
		// Stale: an older copy under a new id cannot exist, so this is a
		// replay of something applied; the claim records it, nothing applies.
	case seq > last+1:
		if err := c.park(ctx, tx, id, "gap", d, 0); err != nil {
			return err
		}
	default:
		if err := c.apply(ctx, tx, id, d.Event); err != nil {
			return err
		}
		if err := c.heal(ctx, tx, d.Event); err != nil {
			return err
		}
	}
	if c.inlineEffect && d.Event.EventType == "order.paid" {
		// The broken way: call out inside the handler, no ledger.
		c.env.provider.charge(key(id), id)
		if c.env.fire(faultEffectCrash, id) {
			return errCrash // provider charged; local commit never happens
		}
	}
	if c.ackBeforeCommit {
		sleepCtx(ctx, ackBeforeCommitWork)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	if c.env.fire(faultAckLoss, id) {
		c.env.log.DebugContext(ctx, "prove: consumer crashed after commit, before ack", slog.String("event_id", id))
		return errCrash
	}
	return d.Ack(ctx)
}

// check re-evaluates the contract and current policy (possession of a
// message is not authorization).
func (c *refInbox) check(ctx context.Context, ex driver.Executor, d *broker.Delivery) (string, error) {
	if d.Event.SchemaVersion > 2 {
		return "schema", nil
	}
	rows, err := ex.Query(ctx, `SELECT allowed FROM prove_policy WHERE principal = $1 AND action = $2`, d.Event.Headers.Principal, "*")
	if err != nil {
		return "", fmt.Errorf("inbox: policy: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		var allowed int
		if err := rows.Scan(&allowed); err != nil {
			return "", fmt.Errorf("inbox: policy: %w", err)
		}
		if allowed == 0 {
			return "unauthorized", nil
		}
	}
	return "", rows.Err()
}

func (c *refInbox) cursor(ctx context.Context, ex driver.Executor, e ferry.Event) (int64, error) {
	rows, err := ex.Query(ctx, `SELECT last_seq FROM prove_cursor WHERE consumer = $1 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4`,
		consumerName, e.TenantID, e.AggregateType, e.AggregateID)
	if err != nil {
		return 0, fmt.Errorf("inbox: cursor: %w", err)
	}
	defer rows.Close()
	var last int64
	if rows.Next() {
		if err := rows.Scan(&last); err != nil {
			return 0, fmt.Errorf("inbox: cursor: %w", err)
		}
	}
	return last, rows.Err()
}

// apply is the business effect: an applied-log row (the checker counts
// them), the cursor, and for payments a pending ledger row the effect
// worker executes after commit.
func (c *refInbox) apply(ctx context.Context, ex driver.Executor, id string, e ferry.Event) error {
	now := time.Now().UnixNano()
	if _, err := ex.Exec(ctx, `INSERT INTO prove_applied (consumer, event_id, tenant_id, aggregate_type, aggregate_id, seq, applied_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		consumerName, id, e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq, now); err != nil {
		return fmt.Errorf("inbox: apply: %w", err)
	}
	c.env.metrics.applied.WithLabelValues(e.TenantID, e.EventType).Inc()
	if _, err := ex.Exec(ctx, sqlFor(ex.Dialect(), `INSERT INTO prove_cursor (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, tenant_id, aggregate_type, aggregate_id) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at`),
		consumerName, e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq, now); err != nil {
		return fmt.Errorf("inbox: cursor: %w", err)
	}
	if e.EventType == "order.paid" && !c.inlineEffect {
		if _, err := ex.Exec(ctx, sqlFor(ex.Dialect(), `INSERT INTO prove_ledger (idem_key, event_id, tenant_id, order_id, status, updated_at) VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT DO NOTHING`),
			key(id), id, e.TenantID, e.AggregateID, now); err != nil {
			return fmt.Errorf("inbox: ledger: %w", err)
		}
	}
	return nil
}

// key is the effect's idempotency key: derived from (consumer, event, step),
// never random, so every retry names the same effect.
func key(eventID string) string { return consumerName + "/" + eventID + "/charge" }

// heal applies parked gap events of e's aggregate that are now next.
func (c *refInbox) heal(ctx context.Context, ex driver.Executor, e ferry.Event) error {
	for seq := e.AggregateSeq + 1; ; seq++ {
		rows, err := ex.Query(ctx, `SELECT event_id, event_type, payload FROM prove_parked WHERE consumer = $1 AND reason = 'gap' AND healed_at = 0
 AND tenant_id = $2 AND aggregate_type = $3 AND aggregate_id = $4 AND seq = $5`, consumerName, e.TenantID, e.AggregateType, e.AggregateID, seq)
		if err != nil {
			return fmt.Errorf("inbox: heal: %w", err)
		}
		var id, typ string
		var payload []byte
		found := rows.Next()
		if found {
			err = rows.Scan(&id, &typ, &payload)
		}
		rows.Close()
		if err != nil {
			return fmt.Errorf("inbox: heal: %w", err)
		}
		if !found {
			return nil
		}
		next := e
		next.AggregateSeq, next.EventType, next.Payload = seq, typ, payload
		if err := c.apply(ctx, ex, id, next); err != nil {
			return err
		}
		if _, err := ex.Exec(ctx, `UPDATE prove_parked SET healed_at = $1 WHERE consumer = $2 AND event_id = $3`, time.Now().UnixNano(), consumerName, id); err != nil {
			return fmt.Errorf("inbox: heal: %w", err)
		}
	}
}

func (c *refInbox) park(ctx context.Context, ex driver.Executor, id, reason string, d *broker.Delivery, attempts int) error {
	now := time.Now().UnixNano()
	e := d.Event
	payload := d.Raw.Body
	if payload == nil {
		payload = []byte{}
	}
	_, err := ex.Exec(ctx, sqlFor(ex.Dialect(), `INSERT INTO prove_parked (consumer, event_id, reason, tenant_id, aggregate_type, aggregate_id, seq, event_type, principal, payload, attempts, first_seen, last_seen)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (consumer, event_id) DO UPDATE SET attempts = prove_parked.attempts + 1, last_seen = excluded.last_seen`),
		consumerName, id, reason, e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq, e.EventType, e.Headers.Principal, payload, attempts, now, now)
	if err != nil {
		return fmt.Errorf("inbox: park: %w", err)
	}
	c.env.metrics.parked.WithLabelValues(reason).Inc()
	return nil
}

// handleNonAtomic is the broken inbox: the claim commits on its own, then
// the effect runs in a second transaction. A crash in between leaves the
// event claimed and never applied; redelivery sees the claim and skips it.
func (c *refInbox) handleNonAtomic(ctx context.Context, d *broker.Delivery) error {
	id := d.Event.ID.String()
	exec := c.env.db.drv.Executor()
	n, err := exec.Exec(ctx, sqlFor(exec.Dialect(), `INSERT INTO prove_inbox (consumer, event_id, fingerprint, claimed_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`),
		consumerName, id, fingerprint(d), time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("inbox: claim: %w", err)
	}
	if n == 0 {
		return d.Ack(ctx)
	}
	if c.env.fire(faultInboxCrash, id) {
		return errCrash
	}
	tx, err := c.env.db.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	last, err := c.cursor(ctx, tx, d.Event)
	if err != nil {
		return err
	}
	if d.Event.AggregateSeq > last {
		if err := c.apply(ctx, tx, id, d.Event); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	return d.Ack(ctx)
}

func queryString(ctx context.Context, ex driver.Executor, q string, args ...any) (string, error) {
	rows, err := ex.Query(ctx, q, args...)
	if err != nil {
		return "", fmt.Errorf("prove: query: %w", err)
	}
	defer rows.Close()
	var s string
	if rows.Next() {
		if err := rows.Scan(&s); err != nil {
			return "", fmt.Errorf("prove: scan: %w", err)
		}
	}
	return s, rows.Err()
}
