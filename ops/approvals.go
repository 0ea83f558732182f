package ops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/opsauth"
)

// Actions a plan can describe, and so an approval request can carry.
const (
	ActionRetryDead      = "dlq.retry"
	ActionDiscardDead    = "dlq.discard"
	ActionReplay         = "outbox.replay"
	ActionRequeueEffects = "effects.requeue"
	ActionParkedReplay   = "parked.replay"
	ActionParkedRelease  = "parked.release_gap"
)

// PlanActions lists the actions PreviewPlan accepts, in a stable order.
var PlanActions = []string{ActionRetryDead, ActionDiscardDead, ActionReplay, ActionRequeueEffects, ActionParkedReplay, ActionParkedRelease}

// Approval statuses.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved" // approved, execution under way (or interrupted)
	ApprovalExecuted = "executed"
	ApprovalRejected = "rejected"
	ApprovalRefused  = "refused" // approval found the rows changed since the preview
)

// More sentinels for approvals.
var (
	// ErrPlanChanged: the rows an approval request covers are no longer in
	// the state its plan hash covered; see *PlanChangedError for the
	// difference.
	ErrPlanChanged = errors.New("ops: the plan's rows changed since the preview")
	// ErrNotApprovable: the identity may not approve (an agent, or not an
	// operator). Wraps opsauth.ErrForbidden too.
	ErrNotApprovable = errors.New("ops: this identity may not approve")
	// ErrAlreadyDecided: the request is no longer pending.
	ErrAlreadyDecided = errors.New("ops: approval request already decided")
)

// ActionSpec is an action and the filter it runs with: exactly one of the
// three filters, matching the action.
type ActionSpec struct {
	Action  string        `json:"action"`
	Outbox  *Filter       `json:"outbox,omitempty"`  // dlq.retry, dlq.discard, outbox.replay
	Effects *EffectFilter `json:"effects,omitempty"` // effects.requeue
	Parked  *ParkedFilter `json:"parked,omitempty"`  // parked.replay, parked.release_gap
}

// PlanRow is one row a plan would change and the state it is in now.
type PlanRow struct {
	Table string `json:"table"`
	ID    int64  `json:"id"`
	// Key is the row's natural key: the event id (outbox), the idempotency
	// key (effects) or the event id (parked).
	Key string `json:"key"`
	// Scope is the row's topic (outbox), consumer (effects, parked):
	// what a policy limits on.
	Scope string `json:"scope"`
	// State is the row's mutable columns, rendered canonically; the plan
	// hash covers it.
	State string `json:"state"`
}

// Plan is what an action would change: the exact rows and their current
// state, and a hash over both. Approval executes only this plan, and only
// while Hash still matches the rows.
type Plan struct {
	Spec ActionSpec `json:"spec"`
	// Rows is how many rows the action would change now.
	Rows int64 `json:"rows"`
	// More: more rows match than the filter's limit; the plan covers the
	// first Rows in id order.
	More bool      `json:"more"`
	Hash string    `json:"plan_hash"`
	Plan []PlanRow `json:"plan_rows"`
	// Sample is up to SampleSize of the rows as listings show them.
	Sample any `json:"sample"`
}

// PreviewPlan computes the plan of spec: it reads the rows the action
// would change with the same listing the action's dry run uses, and hashes
// the action, its filter and every row's id and state. It changes nothing.
func (o *Ops) PreviewPlan(ctx context.Context, spec ActionSpec) (Plan, error) {
	p := Plan{Spec: spec}
	switch spec.Action {
	case ActionRetryDead, ActionDiscardDead, ActionReplay:
		if spec.Outbox == nil || spec.Effects != nil || spec.Parked != nil {
			return p, &ArgError{Field: "spec.outbox", Reason: spec.Action + " takes an outbox filter only"}
		}
		f := *spec.Outbox
		if err := refuseCursor(f.After); err != nil {
			return p, err
		}
		if f.empty() && !f.All {
			return p, fmt.Errorf("%w: give event ids or a filter, or all", ErrEmptyFilter)
		}
		var page Page[OutboxMessage]
		var err error
		if spec.Action == ActionReplay {
			page, err = o.listOutbox(ctx, setSent, f)
		} else {
			page, err = o.ListDeadPage(ctx, f, false)
		}
		if err != nil {
			return p, err
		}
		for _, m := range page.Rows {
			p.Plan = append(p.Plan, PlanRow{Table: "outbox", ID: m.ID, Key: m.EventID, Scope: m.Topic,
				State: fmt.Sprintf("status=%s attempts=%d discarded=%t published_at=%s last_error=%q", m.Status, m.Attempts,
					m.DiscardedAt != nil, fmtTime(m.PublishedAt), m.LastError)})
		}
		p.More, p.Sample = page.NextCursor != "", sample(page.Rows)
	case ActionRequeueEffects:
		if spec.Effects == nil || spec.Outbox != nil || spec.Parked != nil {
			return p, &ArgError{Field: "spec.effects", Reason: spec.Action + " takes an effects filter only"}
		}
		f := *spec.Effects
		if err := refuseCursor(f.After); err != nil {
			return p, err
		}
		if f.empty() && !f.All {
			return p, fmt.Errorf("%w: give keys or a filter, or all", ErrEmptyFilter)
		}
		page, err := o.ListFailedEffectsPage(ctx, f)
		if err != nil {
			return p, err
		}
		for _, e := range page.Rows {
			p.Plan = append(p.Plan, PlanRow{Table: "effects", ID: e.ID, Key: e.Key, Scope: e.Consumer,
				State: fmt.Sprintf("state=failed attempts=%d reconciliations=%d last_error=%q", e.Attempts, e.Reconciliations, e.LastError)})
		}
		p.More, p.Sample = page.NextCursor != "", sample(page.Rows)
	case ActionParkedReplay, ActionParkedRelease:
		if spec.Parked == nil || spec.Outbox != nil || spec.Effects != nil {
			return p, &ArgError{Field: "spec.parked", Reason: spec.Action + " takes a parked filter only"}
		}
		f := *spec.Parked
		if err := refuseCursor(f.After); err != nil {
			return p, err
		}
		if f.IncludeResolved {
			return p, &ArgError{Field: "spec.parked.include_resolved", Reason: "actions apply to open rows only"}
		}
		if spec.Action == ActionParkedRelease {
			if f.Reason != "" && f.Reason != "gap" {
				return p, &ArgError{Field: "spec.parked.reason", Reason: "release-gap applies to gap messages only"}
			}
			f.Reason = "gap"
		}
		if f.empty() && !f.All {
			return p, fmt.Errorf("%w: give ids or a filter, or all", ErrEmptyFilter)
		}
		page, err := o.ListParkedPage(ctx, f)
		if err != nil {
			return p, err
		}
		for _, m := range page.Rows {
			p.Plan = append(p.Plan, PlanRow{Table: "inbox_parked", ID: m.ID, Key: m.EventID, Scope: m.Consumer,
				State: fmt.Sprintf("reason=%s attempts=%d last_seen=%s resolved=%t replay_requested=%s", m.Reason, m.Attempts,
					m.LastSeen.UTC().Format(time.RFC3339Nano), m.ResolvedAt != nil, fmtTime(m.ReplayRequestedAt))})
		}
		p.More, p.Sample = page.NextCursor != "", sample(page.Rows)
	default:
		return p, &ArgError{Field: "action", Reason: fmt.Sprintf("must be one of %s, got %q", strings.Join(PlanActions, ", "), spec.Action)}
	}
	if p.Plan == nil {
		p.Plan = []PlanRow{}
	}
	p.Rows = int64(len(p.Plan))
	h, err := planHash(spec, p.Plan)
	if err != nil {
		return p, err
	}
	p.Hash = h
	return p, nil
}

func sample[T any](rows []T) []T {
	if len(rows) > SampleSize {
		return rows[:SampleSize]
	}
	if rows == nil {
		return []T{}
	}
	return rows
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// planHash is "sha256:" and the hex SHA-256 of the spec's JSON and every
// row's table, id, key and state, one per line in id order.
func planHash(spec ActionSpec, rows []PlanRow) (string, error) {
	sj, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("ops: plan spec: %w", err)
	}
	h := sha256.New()
	h.Write(sj)
	h.Write([]byte{'\n'})
	for _, r := range rows {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\n", r.Table, r.ID, r.Key, r.State)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// PlanDiff is what changed between a plan and the rows now.
type PlanDiff struct {
	// Added rows match now but were not in the plan.
	Added []PlanRow `json:"added,omitempty"`
	// Removed rows were planned but no longer match (the relay or another
	// operator changed them, or cleanup deleted them).
	Removed []PlanRow `json:"removed,omitempty"`
	// Changed rows still match but their state differs.
	Changed []RowChange `json:"changed,omitempty"`
}

// RowChange is one planned row whose state changed.
type RowChange struct {
	Table  string `json:"table"`
	ID     int64  `json:"id"`
	Key    string `json:"key"`
	Before string `json:"before"`
	After  string `json:"after"`
}

func (d PlanDiff) String() string {
	var parts []string
	for _, r := range d.Removed {
		parts = append(parts, fmt.Sprintf("%s row %d (%s) no longer matches", r.Table, r.ID, r.Key))
	}
	for _, r := range d.Added {
		parts = append(parts, fmt.Sprintf("%s row %d (%s) matches now but was not previewed", r.Table, r.ID, r.Key))
	}
	for _, c := range d.Changed {
		parts = append(parts, fmt.Sprintf("%s row %d (%s) changed from [%s] to [%s]", c.Table, c.ID, c.Key, c.Before, c.After))
	}
	if len(parts) == 0 {
		return "the filter or action differs"
	}
	return strings.Join(parts, "; ")
}

func diffPlans(before, after []PlanRow) PlanDiff {
	key := func(r PlanRow) string { return r.Table + "\x00" + strconv.FormatInt(r.ID, 10) }
	now := map[string]PlanRow{}
	for _, r := range after {
		now[key(r)] = r
	}
	var d PlanDiff
	seen := map[string]bool{}
	for _, b := range before {
		k := key(b)
		seen[k] = true
		a, ok := now[k]
		switch {
		case !ok:
			d.Removed = append(d.Removed, b)
		case a.State != b.State:
			d.Changed = append(d.Changed, RowChange{Table: b.Table, ID: b.ID, Key: b.Key, Before: b.State, After: a.State})
		}
	}
	for _, a := range after {
		if !seen[key(a)] {
			d.Added = append(d.Added, a)
		}
	}
	return d
}

// PlanChangedError says how the rows differ from the plan.
type PlanChangedError struct {
	Hash, Now string
	Diff      PlanDiff
}

func (e *PlanChangedError) Error() string {
	return fmt.Sprintf("ops: refusing: the rows changed since the preview (plan %s, now %s): %s", e.Hash, e.Now, e.Diff)
}

// Is reports ErrPlanChanged.
func (e *PlanChangedError) Is(target error) bool { return target == ErrPlanChanged }

// ApprovalRequest is one row of the approvals table.
type ApprovalRequest struct {
	ID             int64      `json:"id"`
	CreatedAt      time.Time  `json:"created_at"`
	Action         string     `json:"action"`
	Spec           ActionSpec `json:"spec"`
	PlanHash       string     `json:"plan_hash"`
	Rows           int64      `json:"rows"`
	Plan           []PlanRow  `json:"plan_rows"`
	RequestedBy    string     `json:"requested_by"`
	RequestedAgent bool       `json:"requested_by_agent"`
	RequestedVia   string     `json:"requested_via"`
	Reason         string     `json:"reason"`
	Status         string     `json:"status"`
	DecidedBy      string     `json:"decided_by,omitempty"`
	DecidedAt      *time.Time `json:"decided_at,omitempty"`
	DecisionReason string     `json:"decision_reason,omitempty"`
	// Result is what execution did (rows changed), or why approval refused.
	Result string `json:"result,omitempty"`
	// AuditID is the audit row of the executed action.
	AuditID *int64 `json:"audit_id,omitempty"`
}

// maxPolicyRows bounds a policy rule's max_rows.
const maxPolicyRows = 1000

// Policy auto-approves named low-risk actions within limits. The zero
// Policy approves nothing.
type Policy struct {
	Rules []PolicyRule `yaml:"rules" json:"rules"`
}

// PolicyRule approves one action when every row is in Scope (when set)
// and the plan covers at most MaxRows rows (and no more match).
type PolicyRule struct {
	// Name is recorded as the approver: "policy:<name>".
	Name   string `yaml:"name" json:"name"`
	Action string `yaml:"action" json:"action"`
	// Topic (outbox actions) or Consumer (effects, parked actions) every
	// row of the plan must have; empty allows any.
	Topic    string `yaml:"topic,omitempty" json:"topic,omitempty"`
	Consumer string `yaml:"consumer,omitempty" json:"consumer,omitempty"`
	// MaxRows is the most rows the rule approves, 1..1000; a plan with
	// more (or with More set) needs a human.
	MaxRows int64 `yaml:"max_rows" json:"max_rows"`
}

// policyActions are the actions a policy may approve: they put rows back
// to work and lose nothing. dlq.discard is never auto-approved.
var policyActions = map[string]bool{ActionRetryDead: true, ActionReplay: true, ActionRequeueEffects: true, ActionParkedReplay: true}

// LoadPolicy reads a policy file (YAML, unknown keys refused).
func LoadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ops: policy file: %w", err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy validates a policy: every rule needs a unique name, an action
// a policy may approve, and max_rows in 1..1000.
func ParsePolicy(b []byte) (*Policy, error) {
	var p Policy
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return nil, &ArgError{Field: "policy", Reason: err.Error()}
	}
	names := map[string]bool{}
	for i, r := range p.Rules {
		field := func(f string) string { return fmt.Sprintf("policy.rules[%d].%s", i, f) }
		if r.Name == "" || len(r.Name) > 100 || names[r.Name] {
			return nil, &ArgError{Field: field("name"), Reason: "required, unique, at most 100 bytes"}
		}
		names[r.Name] = true
		if !policyActions[r.Action] {
			return nil, &ArgError{Field: field("action"), Reason: fmt.Sprintf("a policy may approve dlq.retry, outbox.replay, effects.requeue or parked.replay, got %q", r.Action)}
		}
		if r.MaxRows < 1 || r.MaxRows > maxPolicyRows {
			return nil, &ArgError{Field: field("max_rows"), Reason: fmt.Sprintf("must be in 1..%d, got %d", maxPolicyRows, r.MaxRows)}
		}
		if r.Topic != "" && r.Consumer != "" {
			return nil, &ArgError{Field: field("topic"), Reason: "give topic (outbox actions) or consumer (effects, parked), not both"}
		}
	}
	return &p, nil
}

// Match returns the rule that would approve plan, if any (nil: none).
func (p *Policy) Match(plan Plan) (PolicyRule, bool) {
	if p == nil || plan.More || plan.Rows == 0 {
		return PolicyRule{}, false
	}
	for _, r := range p.Rules {
		if r.Action != plan.Spec.Action || plan.Rows > r.MaxRows {
			continue
		}
		scope := r.Topic + r.Consumer
		ok := true
		for _, row := range plan.Plan {
			if scope != "" && row.Scope != scope {
				ok = false
			}
		}
		if ok {
			return r, true
		}
	}
	return PolicyRule{}, false
}

// RequestAction records a pending approval request for plan, by the
// authenticated identity by, after checking that the rows are still as the
// plan says (else *PlanChangedError). by must have the operator role (an
// agent may be an operator: it proposes, it cannot approve). When policy
// has a rule that covers the plan, the request is approved by the policy
// and executed at once (still recorded as requested by by). Audit rows:
// approval.request, and approval.approve plus the action's own when the
// policy approves.
func (o *Ops) RequestAction(ctx context.Context, plan Plan, by opsauth.Identity, reason string, policy *Policy) (ApprovalRequest, error) {
	if by.Name == "" {
		return ApprovalRequest{}, fmt.Errorf("%w: no authenticated identity", ErrActorRequired)
	}
	if !by.Role.Allows(opsauth.RoleOperator) {
		return ApprovalRequest{}, fmt.Errorf("%w: %s has role %s; requesting %s needs operator", opsauth.ErrForbidden, by.Name, by.Role, plan.Spec.Action)
	}
	a := Approval{Approve: true, Actor: by.Name, Reason: reason}
	if err := a.check(); err != nil {
		return ApprovalRequest{}, err
	}
	now, err := o.PreviewPlan(ctx, plan.Spec)
	if err != nil {
		return ApprovalRequest{}, err
	}
	if now.Hash != plan.Hash {
		return ApprovalRequest{}, &PlanChangedError{Hash: plan.Hash, Now: now.Hash, Diff: diffPlans(plan.Plan, now.Plan)}
	}
	if now.Rows == 0 {
		return ApprovalRequest{}, &ArgError{Field: "plan_hash", Reason: "the plan changes no rows; there is nothing to approve"}
	}
	sj, err := json.Marshal(plan.Spec)
	if err != nil {
		return ApprovalRequest{}, fmt.Errorf("ops: approval spec: %w", err)
	}
	rj, err := json.Marshal(now.Plan)
	if err != nil {
		return ApprovalRequest{}, fmt.Errorf("ops: approval rows: %w", err)
	}
	var id int64
	err = o.inTx(ctx, func(tx driver.Tx) error {
		var err error
		if id, err = o.insertID(ctx, tx, fmt.Sprintf(`INSERT INTO %s (created_at, action, spec, plan_hash, row_count, plan_rows, requested_by, requested_agent, requested_via, reason, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending')`, o.t("ops_approvals")),
			[]any{o.now(), plan.Spec.Action, string(sj), now.Hash, now.Rows, string(rj), by.Name, by.Agent, by.Source, reason}); err != nil {
			return fmt.Errorf("ops: record approval request: %w", err)
		}
		_, err = o.writeAudit(ctx, tx, "approval.request", a, approvalFilter(id, plan.Spec.Action, now.Hash), planKeys(now.Plan), now.Rows)
		return err
	})
	if err != nil {
		return ApprovalRequest{}, err
	}
	if rule, ok := policy.Match(now); ok {
		return o.decide(ctx, id, opsauth.Identity{Name: "policy:" + rule.Name, Role: opsauth.RoleOperator, Source: "policy"},
			fmt.Sprintf("auto-approved by policy rule %q (%s, at most %d rows)", rule.Name, rule.Action, rule.MaxRows), true)
	}
	return o.GetApproval(ctx, id)
}

func approvalFilter(id int64, action, hash string) map[string]any {
	return map[string]any{"approval_id": id, "action": action, "plan_hash": hash}
}

func planKeys(rows []PlanRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Key
	}
	return out
}

// ApproveRequest approves pending request id and executes exactly its
// plan: it recomputes the plan, refuses (status refused, the difference in
// the error and the row) when any row changed, and otherwise runs the
// action on exactly the planned rows. by must be able to approve (an
// operator that is not an agent): an agent is refused, its own request
// included, and the refusal is audited.
func (o *Ops) ApproveRequest(ctx context.Context, id int64, by opsauth.Identity, reason string) (ApprovalRequest, error) {
	if !by.CanApprove() {
		a := Approval{Approve: true, Actor: nonEmpty(by.Name, "unknown"), Reason: nonEmpty(reason, "approval attempt")}
		_ = o.inTx(ctx, func(tx driver.Tx) error {
			_, err := o.writeAudit(ctx, tx, "approval.approve_refused", a, map[string]any{"approval_id": id, "agent": by.Agent, "role": by.Role}, nil, 0)
			return err
		})
		what := "an agent identity never approves, its own requests included"
		if !by.Agent {
			what = fmt.Sprintf("role %s cannot approve; operator needed", by.Role)
		}
		return ApprovalRequest{}, fmt.Errorf("%w: %s: %s (%w)", ErrNotApprovable, by.Name, what, opsauth.ErrForbidden)
	}
	return o.decide(ctx, id, by, reason, true)
}

// RejectRequest rejects pending request id; nothing runs. by must be able
// to approve.
func (o *Ops) RejectRequest(ctx context.Context, id int64, by opsauth.Identity, reason string) (ApprovalRequest, error) {
	if !by.CanApprove() {
		return ApprovalRequest{}, fmt.Errorf("%w: %s may not decide approval requests (%w)", ErrNotApprovable, by.Name, opsauth.ErrForbidden)
	}
	return o.decide(ctx, id, by, reason, false)
}

func nonEmpty(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

func (o *Ops) decide(ctx context.Context, id int64, by opsauth.Identity, reason string, approve bool) (ApprovalRequest, error) {
	a := Approval{Approve: true, Actor: by.Name, Reason: reason}
	if err := a.check(); err != nil {
		return ApprovalRequest{}, err
	}
	req, err := o.GetApproval(ctx, id)
	if err != nil {
		return ApprovalRequest{}, err
	}
	next, step := ApprovalRejected, "approval.reject"
	if approve {
		next, step = ApprovalApproved, "approval.approve"
	}
	// Claim the decision: only one approver wins a pending request.
	err = o.inTx(ctx, func(tx driver.Tx) error {
		n, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET status = $1, decided_by = $2, decided_at = $3, decision_reason = $4 WHERE id = $5 AND status = 'pending'`, o.t("ops_approvals")),
			next, by.Name, o.now(), reason, id)
		if err != nil {
			return fmt.Errorf("ops: decide approval %d: %w", id, err)
		}
		if n != 1 {
			return fmt.Errorf("%w: request %d is %s", ErrAlreadyDecided, id, req.Status)
		}
		_, err = o.writeAudit(ctx, tx, step, a, approvalFilter(id, req.Action, req.PlanHash), planKeys(req.Plan), req.Rows)
		return err
	})
	if err != nil || !approve {
		if err != nil {
			return ApprovalRequest{}, err
		}
		return o.GetApproval(ctx, id)
	}
	now, err := o.PreviewPlan(ctx, req.Spec)
	if err == nil && now.Hash != req.PlanHash {
		err = &PlanChangedError{Hash: req.PlanHash, Now: now.Hash, Diff: diffPlans(req.Plan, now.Plan)}
	}
	if err != nil {
		o.finish(ctx, id, ApprovalRefused, err.Error(), nil, a)
		return ApprovalRequest{}, err
	}
	exact := Approval{Approve: true, Actor: by.Name, Reason: fmt.Sprintf("approval request %d (requested by %s: %s): %s", id, req.RequestedBy, req.Reason, reason)}
	changed, auditID, err := o.execute(ctx, req, exact)
	if err != nil {
		o.finish(ctx, id, ApprovalRefused, "execution failed: "+err.Error(), nil, a)
		return ApprovalRequest{}, err
	}
	result := fmt.Sprintf("%s changed %d of %d planned rows", req.Action, changed, req.Rows)
	o.finish(ctx, id, ApprovalExecuted, result, &auditID, a)
	return o.GetApproval(ctx, id)
}

// execute runs the request's action on exactly its planned rows: the
// filter is the original one narrowed to the planned ids, so a row that
// left the set meanwhile is not touched (each action's own guard) and no
// other row can be.
func (o *Ops) execute(ctx context.Context, req ApprovalRequest, a Approval) (int64, int64, error) {
	n := len(req.Plan)
	switch req.Action {
	case ActionRetryDead, ActionDiscardDead, ActionReplay:
		f := *req.Spec.Outbox
		f.EventIDs, f.Limit, f.All = planKeys(req.Plan), n, false
		var r Result
		var err error
		switch req.Action {
		case ActionRetryDead:
			r, err = o.RetryDead(ctx, f, a)
		case ActionDiscardDead:
			r, err = o.DiscardDead(ctx, f, a)
		default:
			r, err = o.Replay(ctx, f, a)
		}
		return r.Rows, r.AuditID, err
	case ActionRequeueEffects:
		f := *req.Spec.Effects
		f.Keys, f.Limit, f.All = planKeys(req.Plan), n, false
		r, err := o.RequeueFailedEffects(ctx, f, a)
		return r.Rows, r.AuditID, err
	case ActionParkedReplay, ActionParkedRelease:
		f := *req.Spec.Parked
		f.IDs, f.Limit, f.All = nil, n, false
		for _, r := range req.Plan {
			f.IDs = append(f.IDs, r.ID)
		}
		var r ParkedResult
		var err error
		if req.Action == ActionParkedReplay {
			r, err = o.RequestReplay(ctx, f, a)
		} else {
			r, err = o.RequestReleaseGap(ctx, f, a)
		}
		return r.Rows, r.AuditID, err
	}
	return 0, 0, &ArgError{Field: "action", Reason: fmt.Sprintf("unknown action %q", req.Action)}
}

func (o *Ops) finish(ctx context.Context, id int64, status, result string, auditID *int64, a Approval) {
	err := o.inTx(ctx, func(tx driver.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET status = $1, result = $2, audit_id = $3 WHERE id = $4`, o.t("ops_approvals")), status, result, auditID, id); err != nil {
			return err
		}
		if status == ApprovalRefused {
			_, err := o.writeAudit(ctx, tx, "approval.refused", Approval{Actor: a.Actor, Reason: result}, map[string]any{"approval_id": id}, nil, 0)
			return err
		}
		return nil
	})
	if err != nil {
		o.cfg.log.ErrorContext(ctx, "ferry ops: record approval outcome", "approval_id", id, "status", status, logattr.Err(err))
	}
}

// GetApproval returns one approval request.
func (o *Ops) GetApproval(ctx context.Context, id int64) (ApprovalRequest, error) {
	rs, err := o.queryApprovals(ctx, "id = $1", []any{id}, 1)
	if err != nil {
		return ApprovalRequest{}, err
	}
	if len(rs) == 0 {
		return ApprovalRequest{}, fmt.Errorf("%w: approval request %d", ErrNotFound, id)
	}
	return rs[0], nil
}

// ListApprovals lists approval requests, newest first, with status (empty:
// all), at most limit (1..MaxActionLimit).
func (o *Ops) ListApprovals(ctx context.Context, status string, limit int) ([]ApprovalRequest, error) {
	if limit < 1 || limit > MaxActionLimit {
		return nil, &ArgError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", MaxActionLimit)}
	}
	switch status {
	case "":
		return o.queryApprovals(ctx, "1 = 1", nil, limit)
	case ApprovalPending, ApprovalApproved, ApprovalExecuted, ApprovalRejected, ApprovalRefused:
		return o.queryApprovals(ctx, "status = $1", []any{status}, limit)
	}
	return nil, &ArgError{Field: "status", Reason: fmt.Sprintf("must be pending, approved, executed, rejected or refused, got %q", status)}
}

func (o *Ops) queryApprovals(ctx context.Context, cond string, args []any, limit int) ([]ApprovalRequest, error) {
	rows, err := o.db.Executor().Query(ctx, fmt.Sprintf(`SELECT id, created_at, action, spec, plan_hash, row_count, plan_rows, requested_by, requested_agent,
requested_via, reason, status, decided_by, decided_at, decision_reason, result, audit_id FROM %s WHERE %s ORDER BY id DESC LIMIT %d`, o.t("ops_approvals"), cond, limit), args...)
	if err != nil {
		return nil, fmt.Errorf("ops: read approvals: %w", err)
	}
	defer rows.Close()
	out := []ApprovalRequest{}
	for rows.Next() {
		var r ApprovalRequest
		var created, decided nullTime
		var spec, planRows string
		if err := rows.Scan(&r.ID, &created, &r.Action, &spec, &r.PlanHash, &r.Rows, &planRows, &r.RequestedBy, &r.RequestedAgent,
			&r.RequestedVia, &r.Reason, &r.Status, &r.DecidedBy, &decided, &r.DecisionReason, &r.Result, &r.AuditID); err != nil {
			return nil, fmt.Errorf("ops: read approvals: %w", err)
		}
		r.CreatedAt, r.DecidedAt = created.Time, decided.ptr()
		if err := json.Unmarshal([]byte(spec), &r.Spec); err != nil {
			return nil, fmt.Errorf("ops: approval %d spec: %w", r.ID, err)
		}
		if err := json.Unmarshal([]byte(planRows), &r.Plan); err != nil {
			return nil, fmt.Errorf("ops: approval %d rows: %w", r.ID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ops: read approvals: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, nil
}
