package prove

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/inbox"
)

// faultConsumer wraps the real broker consumer: it counts deliveries
// (prove's own record, independent of the inbox's) and defers planned
// events once, so later events of their aggregate arrive first.
type faultConsumer struct {
	broker.Consumer
	env *env
}

var _ broker.Consumer = (*faultConsumer)(nil)

func (c *faultConsumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	return c.Consumer.Consume(ctx, func(ctx context.Context, d *broker.Delivery) {
		id := d.Raw.Headers["Nats-Msg-Id"]
		if d.DecodeErr == nil {
			id = d.Event.ID.String()
		}
		c.env.rec.mu.Lock()
		c.env.rec.deliveries[id]++
		c.env.rec.mu.Unlock()
		if d.DecodeErr == nil && c.env.fire(faultReorder, id) {
			_ = d.Nack(ctx, 300*time.Millisecond)
			return
		}
		handle(ctx, d)
	})
}

var supportedSchemas = []inbox.SchemaKey{
	{EventType: "order.created", SchemaVersion: 1}, {EventType: "order.line_added", SchemaVersion: 1},
	{EventType: "order.paid", SchemaVersion: 1}, {EventType: "order.shipped", SchemaVersion: 1},
	{EventType: "order.cancelled", SchemaVersion: 1},
}

// runRealInbox runs package inbox as the consumer until ctx ends or a
// planned fault crashes it. The handler is the scenario's business
// effect: an applied-log row and, for payments, an effect intent.
func (e *env) runRealInbox(ctx context.Context, durable string, inlineEffect, unordered bool) error {
	cons, err := e.newConsumer(ctx, durable)
	if err != nil {
		return err
	}
	defer cons.Close()
	handler := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
		id := ev.ID.String()
		if bytes.Contains(ev.Payload, []byte(`"poison":true`)) {
			err := fmt.Errorf("order %s: %w", ev.AggregateID, errPoison) // retried, then parked as poison
			e.rec.err(err)
			return err
		}
		ex := e.db.drv.UnwrapExecutor(tx)
		if _, err := ex.Exec(ctx, `INSERT INTO prove_applied (consumer, event_id, tenant_id, aggregate_type, aggregate_id, seq, applied_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			consumerName, id, ev.TenantID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		e.metrics.applied.WithLabelValues(ev.TenantID, ev.EventType).Inc()
		if ev.EventType != "order.paid" {
			return nil
		}
		if inlineEffect {
			e.provider.charge(key(id), id) // the broken way: no ledger
			return nil
		}
		return e.recordRealIntent(ctx, tx, ev)
	}
	authorize := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
		rows, err := tx.QueryContext(ctx, rawSQL(e.db.dialect, `SELECT allowed FROM prove_policy WHERE principal = $1 AND action = '*'`), ev.Headers.Principal)
		if err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		defer rows.Close()
		if rows.Next() {
			var allowed int
			if err := rows.Scan(&allowed); err != nil {
				return fmt.Errorf("policy: %w", err)
			}
			if allowed == 0 {
				return fmt.Errorf("principal %s no longer allowed", ev.Headers.Principal)
			}
		}
		return rows.Err()
	}
	faults := inbox.Faults{
		BeforeCommit: func(ev ferry.Event) error {
			if inlineEffect && ev.EventType == "order.paid" && e.fire(faultEffectCrash, ev.ID.String()) {
				return errCrash // the provider charged; the local commit never happens
			}
			return nil
		},
		AfterCommitBeforeAck: func(ev ferry.Event) error {
			if e.fire(faultAckLoss, ev.ID.String()) {
				return errCrash
			}
			return nil
		},
	}
	opts := []inbox.Option{
		inbox.WithSchemas(supportedSchemas...),
		inbox.WithAuthorizer(authorize),
		inbox.WithMaxAttempts(3),
		inbox.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
		inbox.WithHealInterval(100 * time.Millisecond),
		inbox.WithDrainTimeout(2 * time.Second),
		inbox.WithLogger(e.log),
		inbox.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"prove_instance": randHex(3)}, e.reg)),
		inbox.WithFaults(faults),
	}
	if unordered {
		// A consumer whose effects commute: no cursor, so the inbox's
		// dedup rows are its only protection against a replay.
		opts = append(opts, inbox.WithoutOrdering())
	}
	ib, err := inbox.New(e.db.drv, consumerName, handler, opts...)
	if err != nil {
		return fmt.Errorf("prove: inbox: %w", err)
	}
	return ib.Run(ctx, &faultConsumer{Consumer: cons, env: e})
}
