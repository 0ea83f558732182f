package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// Approval is what every mutating action needs. Without Approve the action
// is a dry run: it reports what would change and changes nothing. With
// Approve it acts and writes one audit row in the same transaction.
type Approval struct {
	// Approve acts; false previews (the default).
	Approve bool
	// Actor is who acts (the CLI uses --actor or $USER). Required to act.
	Actor string
	// Reason says why, in words a later reader understands. Required to
	// act; a dry run needs neither Actor nor Reason, as it changes nothing.
	Reason string
}

// Limits on audit fields.
const (
	maxActorLen  = 200
	maxReasonLen = 2000
)

func (a Approval) check() error {
	if !a.Approve {
		return nil
	}
	if strings.TrimSpace(a.Reason) == "" {
		return fmt.Errorf("%w: pass --reason (why you are doing this)", ErrReasonRequired)
	}
	if len(a.Reason) > maxReasonLen {
		return &ArgError{Field: "reason", Reason: fmt.Sprintf("at most %d bytes", maxReasonLen)}
	}
	if strings.TrimSpace(a.Actor) == "" {
		return fmt.Errorf("%w: pass --actor or set $USER", ErrActorRequired)
	}
	if len(a.Actor) > maxActorLen {
		return &ArgError{Field: "actor", Reason: fmt.Sprintf("at most %d bytes", maxActorLen)}
	}
	return nil
}

// AuditEntry is one row of the audit table.
type AuditEntry struct {
	ID       int64     `json:"id"`
	At       time.Time `json:"at"`
	Actor    string    `json:"actor"`
	Action   string    `json:"action"`
	Filter   string    `json:"filter"` // JSON of the filter the action ran with
	RowCount int64     `json:"row_count"`
	Reason   string    `json:"reason"`
	IDs      string    `json:"ids"` // JSON array of the row ids (event ids) changed
}

// writeAudit inserts an audit row inside tx and returns its id.
func (o *Ops) writeAudit(ctx context.Context, tx driver.Executor, action string, a Approval, filter any, ids []string, n int64) (int64, error) {
	fj, err := json.Marshal(filter)
	if err != nil {
		return 0, fmt.Errorf("ops: audit filter: %w", err)
	}
	if ids == nil {
		ids = []string{}
	}
	ij, err := json.Marshal(ids)
	if err != nil {
		return 0, fmt.Errorf("ops: audit ids: %w", err)
	}
	id, err := o.insertID(ctx, tx, fmt.Sprintf(`INSERT INTO %s (at, actor, action, filter, row_count, reason, ids) VALUES ($1, $2, $3, $4, $5, $6, $7)`, o.t("ops_audit")),
		[]any{o.now(), a.Actor, action, string(fj), n, a.Reason, string(ij)})
	if err != nil {
		return 0, fmt.Errorf("ops: write audit row: %w", err)
	}
	o.cfg.log.InfoContext(ctx, "ferry ops action", "action", action, "actor", a.Actor, "rows", n, "audit_id", id)
	return id, nil
}

// Audit returns the most recent audit rows, newest first.
func (o *Ops) Audit(ctx context.Context, limit int) ([]AuditEntry, error) {
	if limit <= 0 || limit > MaxActionLimit {
		return nil, &ArgError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", MaxActionLimit)}
	}
	rows, err := o.db.Executor().Query(ctx, fmt.Sprintf(`SELECT id, at, actor, action, filter, row_count, reason, ids FROM %s ORDER BY id DESC LIMIT $1`, o.t("ops_audit")), limit)
	if err != nil {
		return nil, fmt.Errorf("ops: read audit: %w", err)
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		if err := rows.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Filter, &e.RowCount, &e.Reason, &e.IDs); err != nil {
			return nil, fmt.Errorf("ops: read audit: %w", err)
		}
		e.At = e.At.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}
