package opsmcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

type whoFunc func(*mcp.CallToolRequest) (opsauth.Identity, error)

// ToolNames are the tools every Ferry MCP server offers, in listing order.
var ToolNames = []string{"whoami", "status", "evidence", "find_events", "list_dead", "list_parked", "list_effects",
	"preview_action", "request_action", "list_approvals"}

func readOnly(title string) *mcp.ToolAnnotations {
	f := false
	return &mcp.ToolAnnotations{Title: title, ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &f}
}

// WhoamiOut is the caller's authenticated identity.
type WhoamiOut struct {
	Identity   opsauth.Identity `json:"identity" jsonschema:"the identity every request and audit row of this session records"`
	CanRequest bool             `json:"can_request_actions" jsonschema:"true when the role allows request_action (operator)"`
	CanApprove bool             `json:"can_approve" jsonschema:"always false for an agent: approval happens in ferry approvals, by a human"`
}

// StatusIn takes no arguments.
type StatusIn struct{}

// StatusOut is ferry status.
type StatusOut struct {
	Status ops.Status `json:"status" jsonschema:"the same snapshot as ferry status --json"`
	// Incomplete explains sections that could not be read (their numbers
	// are unknown, not zero).
	Incomplete string `json:"incomplete,omitempty" jsonschema:"set when a section could not be read: its numbers are unknown, not zero"`
}

// FindEventsIn searches the outbox.
type FindEventsIn struct {
	EventID       string `json:"event_id,omitempty" jsonschema:"exact event id (UUID)"`
	TenantID      string `json:"tenant_id,omitempty"`
	AggregateType string `json:"aggregate_type,omitempty" jsonschema:"with aggregate_id: the aggregate's events in sequence order"`
	AggregateID   string `json:"aggregate_id,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	Status        string `json:"status,omitempty" jsonschema:"pending, sent, dead or discarded"`
	Since         string `json:"since,omitempty" jsonschema:"RFC 3339 time: created at or after"`
	Until         string `json:"until,omitempty" jsonschema:"RFC 3339 time: created before"`
	Limit         int    `json:"limit,omitempty" jsonschema:"rows per page, 1..1000 (default 50)"`
	After         string `json:"after,omitempty" jsonschema:"next_cursor of the previous page"`
}

// ListDeadIn filters dead letters.
type ListDeadIn struct {
	Topic            string   `json:"topic,omitempty"`
	TenantID         string   `json:"tenant_id,omitempty"`
	AggregateType    string   `json:"aggregate_type,omitempty"`
	AggregateID      string   `json:"aggregate_id,omitempty"`
	EventType        string   `json:"event_type,omitempty"`
	EventIDs         []string `json:"event_ids,omitempty"`
	ErrorContains    string   `json:"error_contains,omitempty" jsonschema:"keep rows whose last error contains this text"`
	OlderThan        string   `json:"older_than,omitempty" jsonschema:"Go duration, e.g. 24h: created at least this long ago"`
	IncludeDiscarded bool     `json:"include_discarded,omitempty"`
	Limit            int      `json:"limit,omitempty" jsonschema:"rows per page, 1..10000 (default 1000)"`
	After            string   `json:"after,omitempty" jsonschema:"next_cursor of the previous page"`
}

// ListParkedIn filters parked inbox messages.
type ListParkedIn struct {
	Consumer        string   `json:"consumer,omitempty"`
	Reason          string   `json:"reason,omitempty" jsonschema:"gap, schema, unauthorized, poison, collision, undecodable, decrypt or claimcheck"`
	IDs             []int64  `json:"ids,omitempty"`
	EventIDs        []string `json:"event_ids,omitempty"`
	TenantID        string   `json:"tenant_id,omitempty"`
	AggregateType   string   `json:"aggregate_type,omitempty"`
	AggregateID     string   `json:"aggregate_id,omitempty"`
	EventType       string   `json:"event_type,omitempty"`
	OlderThan       string   `json:"older_than,omitempty" jsonschema:"Go duration: first seen at least this long ago"`
	IncludeResolved bool     `json:"include_resolved,omitempty"`
	Limit           int      `json:"limit,omitempty" jsonschema:"rows per page, 1..10000 (default 1000)"`
	After           string   `json:"after,omitempty" jsonschema:"next_cursor of the previous page"`
}

// ListEffectsIn filters failed effects.
type ListEffectsIn struct {
	Keys          []string `json:"keys,omitempty" jsonschema:"exact idempotency keys"`
	Consumer      string   `json:"consumer,omitempty"`
	Target        string   `json:"target,omitempty"`
	TenantID      string   `json:"tenant_id,omitempty"`
	ErrorContains string   `json:"error_contains,omitempty"`
	Limit         int      `json:"limit,omitempty" jsonschema:"rows per page, 1..10000 (default 1000)"`
	After         string   `json:"after,omitempty" jsonschema:"next_cursor of the previous page"`
}

// PreviewIn names an action and its filter.
type PreviewIn struct {
	Action string `json:"action" jsonschema:"dlq.retry, dlq.discard, outbox.replay (outbox filter); effects.requeue (effects filter); parked.replay, parked.release_gap (parked filter)"`
	// Outbox filter (dlq.*, outbox.replay).
	EventIDs      []string `json:"event_ids,omitempty" jsonschema:"outbox or parked: exact event ids"`
	Topic         string   `json:"topic,omitempty" jsonschema:"outbox: topic"`
	TenantID      string   `json:"tenant_id,omitempty"`
	AggregateType string   `json:"aggregate_type,omitempty"`
	AggregateID   string   `json:"aggregate_id,omitempty"`
	EventType     string   `json:"event_type,omitempty"`
	ErrorContains string   `json:"error_contains,omitempty" jsonschema:"outbox or effects: last error contains this text"`
	OlderThan     string   `json:"older_than,omitempty" jsonschema:"Go duration: outbox rows created, or parked rows first seen, at least this long ago"`
	// Effects filter (effects.requeue).
	Keys   []string `json:"keys,omitempty" jsonschema:"effects: exact idempotency keys"`
	Target string   `json:"target,omitempty" jsonschema:"effects: target system"`
	// Parked filter (parked.*) and effects.
	Consumer string  `json:"consumer,omitempty" jsonschema:"effects or parked: consumer name"`
	Reason   string  `json:"reason,omitempty" jsonschema:"parked: gap, schema, unauthorized, poison, collision, undecodable, decrypt, claimcheck"`
	IDs      []int64 `json:"ids,omitempty" jsonschema:"parked: row ids"`
	All      bool    `json:"all,omitempty" jsonschema:"act on every matching row although no other criterion is given"`
	// Cleanup (preview only).
	Retention string `json:"retention,omitempty" jsonschema:"cleanup: Go duration; counts the rows ferry cleanup --retention would delete (refused below the replay window)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"the plan covers at most this many rows, in id order (default 1000)"`
}

// PreviewOut is a plan.
type PreviewOut struct {
	Action   string        `json:"action"`
	Rows     int64         `json:"rows" jsonschema:"rows the action would change now"`
	More     bool          `json:"more" jsonschema:"more rows match than the limit; the plan covers the first ones"`
	PlanHash string        `json:"plan_hash" jsonschema:"hash over the action, the filter and every row's id and state; pass it to request_action"`
	PlanRows []ops.PlanRow `json:"plan_rows" jsonschema:"every row of the plan with the state the hash covers"`
	Sample   any           `json:"sample" jsonschema:"up to 20 of the rows as the listings show them"`
	// AutoApprove names the policy rule that would approve a request of
	// this plan, if any.
	AutoApprove string `json:"auto_approve,omitempty" jsonschema:"the policy rule that would approve request_action at once; empty: a human must approve"`
	Note        string `json:"note"`
}

// RequestIn requests a previewed plan.
type RequestIn struct {
	PlanHash string `json:"plan_hash" jsonschema:"the plan_hash preview_action returned (kept 1 hour by this server)"`
	Reason   string `json:"reason" jsonschema:"why, in words the human approver and a later reader understand (1..2000 bytes)"`
}

// ApprovalOut is an approval request.
type ApprovalOut struct {
	Request ops.ApprovalRequest `json:"request"`
	Next    string              `json:"next" jsonschema:"what happens now"`
}

// ListApprovalsIn filters approval requests.
type ListApprovalsIn struct {
	Status string `json:"status,omitempty" jsonschema:"pending, approved, executed, rejected or refused; empty: all"`
	Limit  int    `json:"limit,omitempty" jsonschema:"1..10000 (default 50)"`
}

// ListApprovalsOut lists approval requests, newest first.
type ListApprovalsOut struct {
	Requests []ops.ApprovalRequest `json:"requests"`
}

func duration(field, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, &ops.ArgError{Field: field, Reason: fmt.Sprintf("a non-negative Go duration such as 24h, got %q", v)}
	}
	return d, nil
}

func rfc3339(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, &ops.ArgError{Field: field, Reason: fmt.Sprintf("an RFC 3339 time, got %q", v)}
	}
	return t, nil
}

func (s *Server) addTools(srv *mcp.Server, who whoFunc) {
	o := s.cfg.Ops
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami", Annotations: readOnly("Who am I"),
		Description: "Returns the identity this server authenticated for you (from the bearer token, or the local user on stdio), " +
			"its role, and whether it may request or approve actions. Audit rows record this identity, never a name you type."},
		func(_ context.Context, req *mcp.CallToolRequest, _ StatusIn) (*mcp.CallToolResult, WhoamiOut, error) {
			id, err := who(req)
			if err != nil {
				return nil, WhoamiOut{}, err
			}
			return nil, WhoamiOut{Identity: id, CanRequest: id.Role.Allows(opsauth.RoleOperator), CanApprove: id.CanApprove()}, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "status", Annotations: readOnly("Pipeline status"),
		Description: "The same figures as `ferry status`: outbox backlog per topic and shard, relays and their leases, consumers' inbox " +
			"and parked counts, open effects, CDC slots. Proves what the tables hold now. Cannot prove what a broker holds or " +
			"what a process is doing this instant; a section that could not be read is reported in `incomplete`, its numbers unknown, not zero."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ StatusIn) (*mcp.CallToolResult, StatusOut, error) {
			if _, err := who(req); err != nil {
				return nil, StatusOut{}, err
			}
			st, err := o.Status(ctx)
			out := StatusOut{Status: st}
			if err != nil {
				if !errors.Is(err, ops.ErrStatusIncomplete) {
					return nil, StatusOut{}, err
				}
				out.Incomplete = err.Error()
			}
			return nil, out, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "evidence", Annotations: readOnly("Evidence of what happened"),
		Description: "Verify instead of assert: did an event, a command or an aggregate's events really get committed, published, applied " +
			"and charged? Give exactly one of event_id, correlation_id, command_key, or aggregate_type+aggregate_id. For each event, " +
			"four stages (committed, published, applied_by, effects) each carry a verdict and the facts behind it, every fact naming its " +
			"source (table and key, broker receipt, audit row). A verdict is `unknown` where the tables cannot say — e.g. a pending row the " +
			"broker may already hold, a consumer whose inbox lives in another database — never guessed. It proves what these tables " +
			"record; it cannot prove what a broker, another database or an outside system did beyond what they acknowledged here."},
		func(ctx context.Context, req *mcp.CallToolRequest, in EvidenceIn) (*mcp.CallToolResult, EvidenceOut, error) {
			if _, err := who(req); err != nil {
				return nil, EvidenceOut{}, err
			}
			out, err := s.evidence(ctx, in)
			return nil, out, err
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "find_events", Annotations: readOnly("Find outbox events"),
		Description: "Search the outbox by event id, tenant, aggregate (in sequence order), correlation id, status and creation time; " +
			"newest first (aggregate: oldest first), paged by next_cursor. Rows carry payload sizes, never payloads. Proves which " +
			"events were committed and their relay status; use evidence for one event's full story."},
		func(ctx context.Context, req *mcp.CallToolRequest, in FindEventsIn) (*mcp.CallToolResult, ops.SearchPage[ops.OutboxMessage], error) {
			var zero ops.SearchPage[ops.OutboxMessage]
			if _, err := who(req); err != nil {
				return nil, zero, err
			}
			since, err := rfc3339("since", in.Since)
			if err != nil {
				return nil, zero, err
			}
			until, err := rfc3339("until", in.Until)
			if err != nil {
				return nil, zero, err
			}
			p, err := o.SearchOutbox(ctx, ops.OutboxQuery{EventID: in.EventID, TenantID: in.TenantID, AggregateType: in.AggregateType,
				AggregateID: in.AggregateID, CorrelationID: in.CorrelationID, Status: in.Status, Since: since, Until: until, Limit: in.Limit, After: in.After})
			return nil, p, err
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "list_dead", Annotations: readOnly("List dead letters"),
		Description: "Dead letters: outbox rows the relay stopped publishing (a permanent broker refusal or attempts exhausted), oldest " +
			"first, with last_error, paged by next_cursor with the total. Proves the relay gave up on them; retrying one is an action: " +
			"preview_action dlq.retry, then request_action."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ListDeadIn) (*mcp.CallToolResult, ops.Page[ops.OutboxMessage], error) {
			var zero ops.Page[ops.OutboxMessage]
			if _, err := who(req); err != nil {
				return nil, zero, err
			}
			older, err := duration("older_than", in.OlderThan)
			if err != nil {
				return nil, zero, err
			}
			p, err := o.ListDeadPage(ctx, ops.Filter{EventIDs: in.EventIDs, Topic: in.Topic, TenantID: in.TenantID, AggregateType: in.AggregateType,
				AggregateID: in.AggregateID, EventType: in.EventType, ErrorContains: in.ErrorContains, OlderThan: older, Limit: in.Limit, After: in.After},
				in.IncludeDiscarded)
			return nil, p, err
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "list_parked", Annotations: readOnly("List parked messages"),
		Description: "Messages a consumer's inbox parked instead of applying (gap in the aggregate's sequence, unknown schema, " +
			"unauthorized principal, poison, fingerprint collision, undecodable), oldest first, paged. Proves the consumer did NOT " +
			"apply them; replaying one is an action (preview_action parked.replay)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ListParkedIn) (*mcp.CallToolResult, ops.Page[ops.ParkedMessage], error) {
			var zero ops.Page[ops.ParkedMessage]
			if _, err := who(req); err != nil {
				return nil, zero, err
			}
			older, err := duration("older_than", in.OlderThan)
			if err != nil {
				return nil, zero, err
			}
			p, err := o.ListParkedPage(ctx, ops.ParkedFilter{Consumer: in.Consumer, Reason: in.Reason, IDs: in.IDs, EventIDs: in.EventIDs,
				TenantID: in.TenantID, AggregateType: in.AggregateType, AggregateID: in.AggregateID, EventType: in.EventType, OlderThan: older,
				IncludeResolved: in.IncludeResolved, Limit: in.Limit, After: in.After})
			return nil, p, err
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "list_effects", Annotations: readOnly("List failed external effects"),
		Description: "Failed effect-ledger intents: calls to outside systems that provably did not apply (rejected, or never reached " +
			"until attempts ran out), paged. Unknown outcomes are never listed here as failed — they stay open until a status query " +
			"settles them (status shows them). Requeueing is an action (preview_action effects.requeue); it reuses the same idempotency key."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ListEffectsIn) (*mcp.CallToolResult, ops.Page[ops.FailedEffect], error) {
			var zero ops.Page[ops.FailedEffect]
			if _, err := who(req); err != nil {
				return nil, zero, err
			}
			p, err := o.ListFailedEffectsPage(ctx, ops.EffectFilter{Keys: in.Keys, Consumer: in.Consumer, Target: in.Target, TenantID: in.TenantID,
				ErrorContains: in.ErrorContains, Limit: in.Limit, After: in.After})
			return nil, p, err
		})

	previewSchema, err := jsonschema.For[PreviewIn](nil)
	if err != nil {
		panic(fmt.Sprintf("opsmcp: preview schema: %v", err)) // a programming error in the struct above
	}
	if p := previewSchema.Properties["action"]; p != nil {
		for _, a := range ops.PlanActions {
			p.Enum = append(p.Enum, a)
		}
		p.Enum = append(p.Enum, actionCleanup)
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "preview_action", InputSchema: previewSchema, Annotations: readOnly("Preview an operator action"),
		Description: "What an operator action would change, without changing anything: the row count, a sample, every row with its " +
			"current state, and a plan_hash over exactly those rows and states. Actions: dlq.retry (dead letters back to pending, the " +
			"relay publishes them), dlq.discard (mark dead letters discarded, kept as evidence), outbox.replay (re-publish sent events " +
			"with their ids; consumers' inboxes absorb duplicates), effects.requeue (failed effects run again with the same key), " +
			"parked.replay and parked.release_gap (the consumer replays parked messages through its live checks). To act, pass the " +
			"plan_hash to request_action; a human approves. cleanup (with retention) only counts what ferry cleanup would delete, per " +
			"table, and cannot be requested here: it deletes by age, so there is no fixed set of rows to approve (plan_hash is empty)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in PreviewIn) (*mcp.CallToolResult, PreviewOut, error) {
			if _, err := who(req); err != nil {
				return nil, PreviewOut{}, err
			}
			if in.Action == actionCleanup {
				return s.previewCleanup(ctx, in)
			}
			spec, err := specOf(in)
			if err != nil {
				return nil, PreviewOut{}, err
			}
			plan, err := o.PreviewPlan(ctx, spec)
			if err != nil {
				return nil, PreviewOut{}, err
			}
			s.plans.put(plan)
			out := PreviewOut{Action: spec.Action, Rows: plan.Rows, More: plan.More, PlanHash: plan.Hash, PlanRows: plan.Plan, Sample: plan.Sample,
				Note: "nothing changed; request_action with this plan_hash proposes it; approval runs exactly these rows, and refuses if any changed"}
			if rule, ok := s.cfg.Policy.Match(plan); ok {
				out.AutoApprove = rule.Name
			}
			return nil, out, nil
		})

	f := false
	mcp.AddTool(srv, &mcp.Tool{Name: "request_action", Annotations: &mcp.ToolAnnotations{Title: "Propose a previewed action", DestructiveHint: &f, OpenWorldHint: &f},
		Description: "Propose the plan preview_action returned, for a human to approve. Records a pending approval request under your " +
			"authenticated identity (not a name you type) with your reason, and an audit row. It does not act: approval (ferry approvals " +
			"approve, by a human operator; never by an agent, its own request included) executes exactly the previewed rows, and only " +
			"if they are still in the previewed state — otherwise it refuses and records what changed. A policy rule may approve a named " +
			"low-risk action at once (the answer says so). Needs the operator role; a viewer is refused. Fails if the rows changed since " +
			"the preview: preview again."},
		func(ctx context.Context, req *mcp.CallToolRequest, in RequestIn) (*mcp.CallToolResult, ApprovalOut, error) {
			id, err := who(req)
			if err != nil {
				return nil, ApprovalOut{}, err
			}
			if !id.Role.Allows(opsauth.RoleOperator) {
				return nil, ApprovalOut{}, fmt.Errorf("%w: %s has role %s; request_action needs operator", opsauth.ErrForbidden, id.Name, id.Role)
			}
			plan, ok := s.plans.get(in.PlanHash)
			if !ok {
				return nil, ApprovalOut{}, &ops.ArgError{Field: "plan_hash", Reason: "unknown or expired here: call preview_action first (this server keeps previews for " + s.cfg.PlanTTL.String() + ")"}
			}
			r, err := o.RequestAction(ctx, plan, id, in.Reason, s.cfg.Policy)
			if err != nil {
				return nil, ApprovalOut{}, err
			}
			next := fmt.Sprintf("pending: a human approves with `ferry approvals approve %d --reason …` or rejects it; you cannot approve it. "+
				"Check with list_approvals; after approval, verify with evidence.", r.ID)
			if r.Status != ops.ApprovalPending {
				next = fmt.Sprintf("%s by %s: %s. Verify with evidence.", r.Status, r.DecidedBy, r.Result)
			}
			s.log.InfoContext(ctx, "ferry mcp: action requested", "approval_id", r.ID, "action", r.Action, "by", id.Name, "rows", r.Rows, "status", r.Status)
			return nil, ApprovalOut{Request: r, Next: next}, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "list_approvals", Annotations: readOnly("List approval requests"),
		Description: "Approval requests, newest first: who requested what, the plan hash and rows, and the decision (pending, executed, " +
			"rejected, refused because rows changed — with what changed). Proves what was proposed and decided; evidence proves what the rows did next."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ListApprovalsIn) (*mcp.CallToolResult, ListApprovalsOut, error) {
			if _, err := who(req); err != nil {
				return nil, ListApprovalsOut{}, err
			}
			limit := in.Limit
			if limit == 0 {
				limit = 50
			}
			rs, err := o.ListApprovals(ctx, in.Status, limit)
			return nil, ListApprovalsOut{Requests: rs}, err
		})
}

func specOf(in PreviewIn) (ops.ActionSpec, error) {
	spec := ops.ActionSpec{Action: in.Action}
	older, err := duration("older_than", in.OlderThan)
	if err != nil {
		return spec, err
	}
	refuse := func(action string, fields map[string]bool) error {
		for name, set := range fields {
			if set {
				return &ops.ArgError{Field: name, Reason: "does not apply to " + action}
			}
		}
		return nil
	}
	switch in.Action {
	case ops.ActionRetryDead, ops.ActionDiscardDead, ops.ActionReplay:
		if err := refuse(in.Action, map[string]bool{"keys": len(in.Keys) > 0, "target": in.Target != "", "consumer": in.Consumer != "",
			"reason": in.Reason != "", "ids": len(in.IDs) > 0}); err != nil {
			return spec, err
		}
		spec.Outbox = &ops.Filter{EventIDs: in.EventIDs, Topic: in.Topic, TenantID: in.TenantID, AggregateType: in.AggregateType,
			AggregateID: in.AggregateID, EventType: in.EventType, ErrorContains: in.ErrorContains, OlderThan: older, All: in.All, Limit: in.Limit}
	case ops.ActionRequeueEffects:
		if err := refuse(in.Action, map[string]bool{"event_ids": len(in.EventIDs) > 0, "topic": in.Topic != "", "aggregate_type": in.AggregateType != "",
			"aggregate_id": in.AggregateID != "", "event_type": in.EventType != "", "older_than": in.OlderThan != "", "reason": in.Reason != "", "ids": len(in.IDs) > 0}); err != nil {
			return spec, err
		}
		spec.Effects = &ops.EffectFilter{Keys: in.Keys, Consumer: in.Consumer, Target: in.Target, TenantID: in.TenantID, ErrorContains: in.ErrorContains,
			All: in.All, Limit: in.Limit}
	case ops.ActionParkedReplay, ops.ActionParkedRelease:
		if err := refuse(in.Action, map[string]bool{"keys": len(in.Keys) > 0, "target": in.Target != "", "topic": in.Topic != "", "error_contains": in.ErrorContains != ""}); err != nil {
			return spec, err
		}
		spec.Parked = &ops.ParkedFilter{Consumer: in.Consumer, Reason: in.Reason, IDs: in.IDs, EventIDs: in.EventIDs, TenantID: in.TenantID,
			AggregateType: in.AggregateType, AggregateID: in.AggregateID, EventType: in.EventType, OlderThan: older, All: in.All, Limit: in.Limit}
	default:
		return spec, &ops.ArgError{Field: "action", Reason: fmt.Sprintf("must be one of %s, got %q", strings.Join(ops.PlanActions, ", "), in.Action)}
	}
	return spec, nil
}

const actionCleanup = "cleanup"

// previewCleanup is ferry cleanup's dry run.
func (s *Server) previewCleanup(ctx context.Context, in PreviewIn) (*mcp.CallToolResult, PreviewOut, error) {
	d, err := duration("retention", in.Retention)
	if err != nil {
		return nil, PreviewOut{}, err
	}
	if d == 0 {
		return nil, PreviewOut{}, &ops.ArgError{Field: "retention", Reason: "required for cleanup, e.g. 168h"}
	}
	res, err := s.cfg.Ops.Cleanup(ctx, ops.CleanupOptions{Retention: d}, ops.Approval{})
	if err != nil {
		return nil, PreviewOut{}, err
	}
	return nil, PreviewOut{Action: actionCleanup, Rows: res.Outbox + res.Discarded + res.Inbox + res.ResolvedParked + res.Effects,
		PlanRows: []ops.PlanRow{}, Sample: res,
		Note: "counts only (sample holds them per table); cleanup deletes by age and is not requestable through MCP: an operator runs ferry cleanup --retention … --approve"}, nil
}
