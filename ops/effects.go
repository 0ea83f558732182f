package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// FailedEffect is an effect-ledger intent in state failed: the outside
// system provably did not apply it — it rejected the call, or it was never
// reached (or a status query found nothing) until attempts ran out. Unknown
// outcomes are never failed; they stay open until reconciled.
type FailedEffect struct {
	ID              int64      `json:"id"`
	Key             string     `json:"idem_key"`
	Consumer        string     `json:"consumer"`
	TenantID        string     `json:"tenant_id"`
	EventID         string     `json:"event_id"`
	Step            string     `json:"step"`
	Target          string     `json:"target"`
	Operation       string     `json:"operation"`
	Attempts        int        `json:"attempts"`
	Reconciliations int        `json:"reconciliations"`
	LastError       string     `json:"last_error"`
	CreatedAt       time.Time  `json:"created_at"`
	CompletedAt     *time.Time `json:"completed_at,omitempty"`
}

// EffectFilter selects failed effects. Empty fields do not filter;
// RequeueFailedEffects refuses an empty filter unless All is set.
type EffectFilter struct {
	Keys          []string // exact idempotency keys
	Consumer      string
	Target        string
	TenantID      string
	ErrorContains string
	All           bool
	// Limit bounds the rows listed or changed (default DefaultActionLimit,
	// at most MaxActionLimit).
	Limit int
	// After is the NextCursor of the previous page (listing only).
	After string
}

func (f EffectFilter) empty() bool {
	return len(f.Keys) == 0 && f.Consumer == "" && f.Target == "" && f.TenantID == "" && f.ErrorContains == ""
}

func (f EffectFilter) check() error {
	if len(f.Keys) > MaxIDs {
		return &ArgError{Field: "filter.keys", Reason: fmt.Sprintf("at most %d keys, got %d", MaxIDs, len(f.Keys))}
	}
	for i, k := range f.Keys {
		if k == "" || len(k) > 255 {
			return &ArgError{Field: fmt.Sprintf("filter.keys[%d]", i), Reason: "must be 1..255 bytes"}
		}
	}
	for _, s := range []struct {
		field, v string
	}{{"filter.consumer", f.Consumer}, {"filter.target", f.Target}, {"filter.tenant_id", f.TenantID}, {"filter.error_contains", f.ErrorContains}} {
		if len(s.v) > 200 {
			return &ArgError{Field: s.field, Reason: "at most 200 bytes"}
		}
	}
	return Filter{Limit: f.Limit}.check()
}

// EffectResult is the outcome of RequeueFailedEffects.
type EffectResult = ActionResult[FailedEffect]

func (o *Ops) effectWhere(w *where, f EffectFilter) {
	w.add("state = 'failed'")
	if len(f.Keys) > 0 {
		vals := make([]any, len(f.Keys))
		for i, k := range f.Keys {
			vals[i] = k
		}
		w.in("idem_key", vals)
	}
	for _, c := range []struct{ col, v string }{{"consumer", f.Consumer}, {"target", f.Target}, {"tenant_id", f.TenantID}} {
		if c.v != "" {
			w.add(c.col+" = ?", c.v)
		}
	}
	if f.ErrorContains != "" {
		w.add(o.containsText("last_error"), f.ErrorContains)
	}
}

func (o *Ops) requireEffects(ctx context.Context) error {
	ok, err := o.tableExists(ctx, o.db.Executor(), "effects")
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: the effect ledger is not installed (ferry migrate up)", ErrUnsupported)
	}
	return nil
}

func (o *Ops) effectCols() string {
	return `id, idem_key, consumer, tenant_id, ` + o.uuidText("event_id") + `, step, target, operation,
    attempts, reconciliations, last_error, created_at, completed_at`
}

func (o *Ops) queryFailedEffects(ctx context.Context, exec driver.Executor, w *where, limit int, lock string) ([]FailedEffect, error) {
	return o.scanFailedEffects(ctx, exec, fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY id LIMIT %d%s`,
		o.effectCols(), o.t("effects"), w.sql(), limit, lock), w.args...)
}

func (o *Ops) scanFailedEffects(ctx context.Context, exec driver.Executor, q string, args ...any) ([]FailedEffect, error) {
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("ops: read failed effects: %w", err)
	}
	defer rows.Close()
	var out []FailedEffect
	for rows.Next() {
		var e FailedEffect
		var created, completed nullTime
		if err := rows.Scan(&e.ID, &e.Key, &e.Consumer, &e.TenantID, &e.EventID, &e.Step, &e.Target, &e.Operation,
			&e.Attempts, &e.Reconciliations, &e.LastError, &created, &completed); err != nil {
			return nil, fmt.Errorf("ops: read failed effects: %w", err)
		}
		e.CreatedAt, e.CompletedAt = created.Time, completed.ptr()
		out = append(out, e)
	}
	return out, rows.Err()
}

// ListFailedEffects lists failed effect intents matching f, oldest first:
// one page of ListFailedEffectsPage.
func (o *Ops) ListFailedEffects(ctx context.Context, f EffectFilter) ([]FailedEffect, error) {
	p, err := o.ListFailedEffectsPage(ctx, f)
	return p.Rows, err
}

// ListFailedEffectsPage lists one page (f.Limit rows, default
// DefaultActionLimit) of the failed intents matching f after f.After, in
// id order, with the cursor of the next page and the total.
func (o *Ops) ListFailedEffectsPage(ctx context.Context, f EffectFilter) (Page[FailedEffect], error) {
	if err := f.check(); err != nil {
		return Page[FailedEffect]{}, err
	}
	if err := o.requireEffects(ctx); err != nil {
		return Page[FailedEffect]{}, err
	}
	w := &where{}
	o.effectWhere(w, f)
	return listPage(ctx, o, "effects", w, f.After, Filter{Limit: f.Limit}.limit(),
		func(exec driver.Executor, q string, args ...any) ([]FailedEffect, error) {
			return o.scanFailedEffects(ctx, exec, q, args...)
		}, o.effectCols(), func(e FailedEffect) int64 { return e.ID })
}

// RequeueFailedEffects puts failed effect intents matching f back to
// pending (attempts 0, due now), so the effect worker runs them again —
// with the same idempotency key, because the key belongs to the intent.
// That is what makes it safe: a failed intent was not applied, and should a
// provider have applied a call after all, it answers the repeated key with
// the stored outcome instead of acting twice. Use it after the cause is
// gone (an outage that outlasted the attempts, a fixed credential); a
// provider that rejected the call caches the rejection under the key, so
// those fail again unless the provider forgets it.
//
// Ops never calls the outside system: the only write is the row, guarded
// by state = 'failed'. The previous error stays in last_error, prefixed
// with the audit id, until the next attempt records its own outcome; the
// audit row lists the keys.
func (o *Ops) RequeueFailedEffects(ctx context.Context, f EffectFilter, a Approval) (EffectResult, error) {
	const action = "effects.requeue"
	if err := f.check(); err != nil {
		return EffectResult{}, err
	}
	if err := refuseCursor(f.After); err != nil {
		return EffectResult{}, err
	}
	if f.empty() && !f.All {
		return EffectResult{}, fmt.Errorf("%w: give keys or a filter (consumer, target, tenant, error text), or All to requeue every failed effect", ErrEmptyFilter)
	}
	if err := a.check(); err != nil {
		return EffectResult{}, err
	}
	if err := o.requireEffects(ctx); err != nil {
		return EffectResult{}, err
	}
	now := o.now()
	res := EffectResult{Action: action, DryRun: !a.Approve}
	limit := Filter{Limit: f.Limit}.limit()
	err := o.inTx(ctx, func(tx driver.Tx) error {
		lock := ""
		if o.rowLocks() && a.Approve {
			lock = " FOR UPDATE" // the worker cannot touch a failed row, but a cleanup could delete it
		}
		w := &where{}
		o.effectWhere(w, f)
		es, err := o.queryFailedEffects(ctx, tx, w, limit+1, lock)
		if err != nil {
			return err
		}
		es, res.More, res.Sample = batch(es, limit)
		res.Rows = int64(len(es))
		if !a.Approve {
			return nil
		}
		keys := make([]string, len(es))
		ids := make([]any, len(es))
		for i, e := range es {
			keys[i], ids[i] = e.Key, e.ID
		}
		auditID, err := o.writeAudit(ctx, tx, action, a, f, keys, res.Rows)
		if err != nil {
			return err
		}
		res.AuditID = auditID
		if len(es) == 0 {
			return nil
		}
		return o.updateIDs(ctx, tx, action, "effects", `state = 'pending', attempts = 0, next_attempt_at = ?, updated_at = ?, completed_at = NULL,
    lease_owner = '', lease_until = NULL, last_error = `+o.prefixText("last_error"),
			[]any{now, now, fmt.Sprintf("requeued (audit %d); was: ", auditID)}, ids, "state = 'failed'")
	})
	if err != nil {
		return EffectResult{}, err
	}
	return res, nil
}
