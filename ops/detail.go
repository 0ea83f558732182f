package ops

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// EffectIntent is one effect-ledger row in any state, without its request
// body (RevealEffectRequest reads that): the detail view of an intent.
// OperationID and ResponseSummary are the outside system's receipt.
type EffectIntent struct {
	ID              int64      `json:"id"`
	Key             string     `json:"idem_key"`
	Consumer        string     `json:"consumer"`
	TenantID        string     `json:"tenant_id"`
	EventID         string     `json:"event_id"`
	Step            string     `json:"step"`
	Target          string     `json:"target"`
	Operation       string     `json:"operation"`
	State           string     `json:"state"`
	Attempts        int        `json:"attempts"`
	Reconciliations int        `json:"reconciliations"`
	NextAttemptAt   time.Time  `json:"next_attempt_at"`
	LeaseOwner      string     `json:"lease_owner"`
	LeaseUntil      *time.Time `json:"lease_until,omitempty"`
	OperationID     string     `json:"operation_id"`
	ResponseSummary string     `json:"response_summary"`
	LastError       string     `json:"last_error"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
	UnknownSince    *time.Time `json:"unknown_since,omitempty"`
	CompletedAt     *time.Time `json:"completed_at,omitempty"`
	RequestBytes    int64      `json:"request_bytes"`
}

// Effect reads one effect intent by id, in any state.
func (o *Ops) Effect(ctx context.Context, id int64) (EffectIntent, error) {
	if err := o.requireEffects(ctx); err != nil {
		return EffectIntent{}, err
	}
	size := "octet_length(request)"
	if o.sqlite() {
		size = "length(request)"
	}
	var e EffectIntent
	var next, leaseUntil, created, updated, unknown, completed nullTime
	found, err := driver.QueryRow(ctx, o.db.Executor(), fmt.Sprintf(`SELECT id, idem_key, consumer, tenant_id, %s, step, target, operation, state,
    attempts, reconciliations, next_attempt_at, lease_owner, lease_until, operation_id, response_summary, last_error,
    created_at, updated_at, unknown_since, completed_at, %s FROM %s WHERE id = $1`, o.uuidText("event_id"), size, o.t("effects")),
		[]any{id}, &e.ID, &e.Key, &e.Consumer, &e.TenantID, &e.EventID, &e.Step, &e.Target, &e.Operation, &e.State,
		&e.Attempts, &e.Reconciliations, &next, &e.LeaseOwner, &leaseUntil, &e.OperationID, &e.ResponseSummary, &e.LastError,
		&created, &updated, &unknown, &completed, &e.RequestBytes)
	if err != nil {
		return EffectIntent{}, fmt.Errorf("ops: read effect %d: %w", id, err)
	}
	if !found {
		return EffectIntent{}, fmt.Errorf("%w: effect intent %d", ErrNotFound, id)
	}
	e.NextAttemptAt, e.CreatedAt, e.UpdatedAt = next.Time, created.Time, updated.Time
	e.LeaseUntil, e.UnknownSince, e.CompletedAt = leaseUntil.ptr(), unknown.ptr(), completed.ptr()
	return e, nil
}

// RevealParkedPayload reads the payload of one parked message: an
// approved action with an audit row "parked.reveal_payload" written in the
// same transaction as the read, as RevealPayload is for the outbox.
// RevealedPayload.EventID is the parked message's event id (may be empty
// for an undecodable message).
func (o *Ops) RevealParkedPayload(ctx context.Context, id int64, a Approval) (RevealedPayload, error) {
	return o.reveal(ctx, "parked.reveal_payload", rowKey(id), a, func(tx driver.Tx, out *RevealedPayload, maskKey *string) (bool, error) {
		return driver.QueryRow(ctx, tx, fmt.Sprintf(`SELECT %s, event_type, content_type, payload FROM %s WHERE id = $1`,
			"COALESCE("+o.uuidText("event_id")+", '')", o.t("inbox_parked")), []any{id}, &out.EventID, maskKey, &out.ContentType, &out.Payload)
	})
}

// RevealEffectRequest reads the request body of one effect intent (what
// the effect worker sends the outside system): an approved action with an
// audit row "effects.reveal_request" written in the same transaction.
// ContentType is empty: the ledger stores the body only.
func (o *Ops) RevealEffectRequest(ctx context.Context, id int64, a Approval) (RevealedPayload, error) {
	if err := o.requireEffects(ctx); err != nil {
		return RevealedPayload{}, err
	}
	return o.reveal(ctx, "effects.reveal_request", rowKey(id), a, func(tx driver.Tx, out *RevealedPayload, maskKey *string) (bool, error) {
		var target, operation string
		found, err := driver.QueryRow(ctx, tx, fmt.Sprintf(`SELECT %s, target, operation, request FROM %s WHERE id = $1`, o.uuidText("event_id"), o.t("effects")),
			[]any{id}, &out.EventID, &target, &operation, &out.Payload)
		*maskKey = "effect:" + target + "/" + operation
		return found, err
	})
}

// revealKey names the row a reveal reads: its audit filter and id, and
// how a not-found error describes it.
type revealKey struct {
	filter map[string]any
	id     string
	what   string
	err    error // the key is invalid
}

func rowKey(id int64) revealKey {
	k := revealKey{filter: map[string]any{"id": id}, id: strconv.FormatInt(id, 10), what: "row " + strconv.FormatInt(id, 10)}
	if id <= 0 {
		k.err = &ArgError{Field: "id", Reason: "a row id > 0"}
	}
	return k
}

// reveal is the one path every payload reveal takes: approval checks, then
// in one transaction the read, the field mask (keyed by the mask key read
// sets; see MaskPolicy) and the audit row, which records the mask's count
// (and withheld) when a mask is set. Nothing leaves unmasked.
func (o *Ops) reveal(ctx context.Context, action string, key revealKey, a Approval, read func(tx driver.Tx, out *RevealedPayload, maskKey *string) (bool, error)) (RevealedPayload, error) {
	if key.err != nil {
		return RevealedPayload{}, key.err
	}
	if !a.Approve {
		return RevealedPayload{}, &ArgError{Field: "approve", Reason: "revealing a payload is an approved action: set approve with a reason"}
	}
	if err := a.check(); err != nil {
		return RevealedPayload{}, err
	}
	var out RevealedPayload
	var maskKey string
	err := o.inTx(ctx, func(tx driver.Tx) error {
		found, err := read(tx, &out, &maskKey)
		if err != nil {
			return fmt.Errorf("ops: %s: %w", action, err)
		}
		if !found {
			return fmt.Errorf("%w: %s: %s", ErrNotFound, action, key.what)
		}
		// Mask before the audit row, which records what the mask did: the
		// row says what the operator saw, not only that a reveal happened.
		o.applyMask(maskKey, &out)
		if o.cfg.mask != nil {
			key.filter["masked_values"] = out.MaskedValues
			if out.Withheld {
				key.filter["withheld"] = true
			}
		}
		out.AuditID, err = o.writeAudit(ctx, tx, action, a, key.filter, []string{key.id}, 1)
		return err
	})
	if err != nil {
		return RevealedPayload{}, err
	}
	return out, nil
}
