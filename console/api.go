package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

// route is one /api/v1 endpoint: the handler and what the OpenAPI
// document says about it, in one place.
type route struct {
	method, path, summary string
	role                  opsauth.Role
	action                bool // state-changing: read-only and agents refused
	query                 any  // struct whose json fields are the query parameters
	body                  any  // request body type
	resp                  any  // 200 response type
	handler               http.Handler
}

// Me is who the console thinks the caller is and what it may do.
type Me struct {
	Name     string       `json:"name"`
	Role     opsauth.Role `json:"role"`
	Agent    bool         `json:"agent"`
	Source   string       `json:"source"`
	CanAct   bool         `json:"can_act"`
	ReadOnly bool         `json:"read_only"`
}

// OverviewCountCap bounds the overview's outbox counts per (topic, shard)
// (ops.WithCountCap): a shard with more shows "1000+".
const OverviewCountCap = 1000

// StatusResponse is the overview: ops.Status and when it was read. Error
// names the sections that could not be read (their numbers are unknown,
// not zero).
type StatusResponse struct {
	Status ops.Status `json:"status"`
	ReadAt time.Time  `json:"read_at"`
	// CountCap is the bound of the outbox counts per (topic, shard)
	// (status.*.counts_capped says which reached it).
	CountCap int64  `json:"count_cap"`
	Error    string `json:"error,omitempty"`
}

// SearchQuery are the outbox search parameters (ops.OutboxQuery).
type SearchQuery struct {
	EventID       string `json:"event_id,omitempty"`
	TenantID      string `json:"tenant_id,omitempty"`
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	Status        string `json:"status,omitempty"`
	Since         string `json:"since,omitempty"`
	Until         string `json:"until,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	After         string `json:"after,omitempty"`
}

// OutboxFilter is ops.Filter as JSON (and query parameters).
type OutboxFilter struct {
	EventIDs      []string `json:"event_ids,omitempty"`
	Topic         string   `json:"topic,omitempty"`
	TenantID      string   `json:"tenant_id,omitempty"`
	AggregateType string   `json:"aggregate_type,omitempty"`
	AggregateID   string   `json:"aggregate_id,omitempty"`
	EventType     string   `json:"event_type,omitempty"`
	ErrorContains string   `json:"error_contains,omitempty"`
	OlderThan     string   `json:"older_than,omitempty"`
	Since         string   `json:"since,omitempty"`
	Until         string   `json:"until,omitempty"`
	All           bool     `json:"all,omitempty"`
	Limit         int      `json:"limit,omitempty"`
}

// DeadQuery lists dead letters.
type DeadQuery struct {
	OutboxFilter
	IncludeDiscarded bool   `json:"include_discarded,omitempty"`
	After            string `json:"after,omitempty"`
}

// ParkedFilter is ops.ParkedFilter as JSON.
type ParkedFilter struct {
	IDs           []int64  `json:"ids,omitempty"`
	EventIDs      []string `json:"event_ids,omitempty"`
	Consumer      string   `json:"consumer,omitempty"`
	Reason        string   `json:"reason,omitempty"`
	TenantID      string   `json:"tenant_id,omitempty"`
	AggregateType string   `json:"aggregate_type,omitempty"`
	AggregateID   string   `json:"aggregate_id,omitempty"`
	EventType     string   `json:"event_type,omitempty"`
	OlderThan     string   `json:"older_than,omitempty"`
	All           bool     `json:"all,omitempty"`
	Limit         int      `json:"limit,omitempty"`
}

// ParkedQuery lists parked messages.
type ParkedQuery struct {
	ParkedFilter
	IncludeResolved bool   `json:"include_resolved,omitempty"`
	After           string `json:"after,omitempty"`
}

// EffectFilter is ops.EffectFilter as JSON.
type EffectFilter struct {
	Keys          []string `json:"keys,omitempty"`
	Consumer      string   `json:"consumer,omitempty"`
	Target        string   `json:"target,omitempty"`
	TenantID      string   `json:"tenant_id,omitempty"`
	ErrorContains string   `json:"error_contains,omitempty"`
	All           bool     `json:"all,omitempty"`
	Limit         int      `json:"limit,omitempty"`
}

// EffectQuery lists failed effect intents.
type EffectQuery struct {
	EffectFilter
	After string `json:"after,omitempty"`
}

// ActionRequest is the body of every action: without approve it is a
// preview (the exact count and a sample, nothing changes); with approve
// and a reason it acts and writes the audit row, whose actor is the
// authenticated identity.
type ActionRequest[F any] struct {
	Filter  F      `json:"filter"`
	Approve bool   `json:"approve,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// RevealRequest reveals one payload (an audited operator action).
type RevealRequest struct {
	Reason string `json:"reason"`
}

// RevealResponse is a revealed payload: as text when it is UTF-8, always
// as base64, after the field mask (ferry console --mask): Masked names the
// mask paths that replaced values with "***"; Withheld means the mask
// names fields for this payload but it is not JSON, so no payload is sent.
type RevealResponse struct {
	EventID        string   `json:"event_id"`
	ContentType    string   `json:"content_type"`
	PayloadText    string   `json:"payload_text,omitempty"`
	PayloadBase64  []byte   `json:"payload_base64"`
	AuditID        int64    `json:"audit_id"`
	Masked         []string `json:"masked,omitempty"`
	MaskedValues   int      `json:"masked_values,omitempty"`
	Withheld       bool     `json:"withheld,omitempty"`
	WithheldReason string   `json:"withheld_reason,omitempty"`
}

// CleanupRequest previews a cleanup (ferry cleanup without --approve).
type CleanupRequest struct {
	Retention        string `json:"retention"`
	InboxRetention   string `json:"inbox_retention,omitempty"`
	EffectRetention  string `json:"effect_retention,omitempty"`
	IncludeDiscarded bool   `json:"include_discarded,omitempty"`
}

// EvidenceQuery asks for the evidence of an event id, correlation id or
// command key.
type EvidenceQuery struct {
	Q    string `json:"q"`
	Kind string `json:"kind,omitempty"`
}

// EvidenceResponse is ops.Evidence and its timeline, each line naming the
// table it was read from.
type EvidenceResponse struct {
	Evidence ops.Evidence   `json:"evidence"`
	Timeline []TimelineLine `json:"timeline"`
}

// TimelineLine is one fact of the evidence.
type TimelineLine struct {
	EventID string     `json:"event_id,omitempty"`
	At      *time.Time `json:"at,omitempty"`
	Step    string     `json:"step"`
	Source  string     `json:"source"` // the table the fact was read from
	Text    string     `json:"text"`
}

// AuditQuery filters the audit log.
type AuditQuery struct {
	Actor  string `json:"actor,omitempty"`
	Action string `json:"action,omitempty"`
	Since  string `json:"since,omitempty"`
	Until  string `json:"until,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	After  string `json:"after,omitempty"`
}

// OneID is the path parameter of the detail endpoints.
type OneID struct{}

func (s *Server) apiRoutes() []route {
	viewer, operator := opsauth.RoleViewer, opsauth.RoleOperator
	return []route{
		{method: "GET", path: "/api/v1/me", summary: "The authenticated identity and what it may do", role: viewer, resp: Me{}, handler: http.HandlerFunc(s.me)},
		{method: "GET", path: "/api/v1/status", summary: "Overview: ops.Status (backlog, leases, relays, consumers, parked, gaps, effects, CDC)", role: viewer, resp: StatusResponse{}, handler: http.HandlerFunc(s.status)},
		{method: "GET", path: "/api/v1/outbox", summary: "Search the outbox (keyset pages, newest first; an aggregate in sequence order)", role: viewer, query: SearchQuery{}, resp: ops.SearchPage[ops.OutboxMessage]{}, handler: http.HandlerFunc(s.search)},
		{method: "GET", path: "/api/v1/outbox/{event_id}", summary: "One outbox row (no payload)", role: viewer, resp: ops.OutboxMessage{}, handler: http.HandlerFunc(s.message)},
		{method: "POST", path: "/api/v1/outbox/{event_id}/reveal", summary: "Reveal one payload (operator; audited as outbox.reveal_payload)", role: operator, action: true, body: RevealRequest{}, resp: RevealResponse{}, handler: http.HandlerFunc(s.reveal)},
		{method: "POST", path: "/api/v1/outbox/replay", summary: "Replay sent events (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[OutboxFilter]{}, resp: ops.Result{}, handler: outboxAction(s, s.o.Replay)},
		{method: "GET", path: "/api/v1/dead", summary: "List dead letters (keyset pages by id, with total)", role: viewer, query: DeadQuery{}, resp: ops.Page[ops.OutboxMessage]{}, handler: http.HandlerFunc(s.dead)},
		{method: "POST", path: "/api/v1/dead/retry", summary: "Retry dead letters (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[OutboxFilter]{}, resp: ops.Result{}, handler: outboxAction(s, s.o.RetryDead)},
		{method: "POST", path: "/api/v1/dead/discard", summary: "Discard dead letters (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[OutboxFilter]{}, resp: ops.Result{}, handler: outboxAction(s, s.o.DiscardDead)},
		{method: "GET", path: "/api/v1/parked", summary: "List parked messages", role: viewer, query: ParkedQuery{}, resp: ops.Page[ops.ParkedMessage]{}, handler: http.HandlerFunc(s.parked)},
		{method: "GET", path: "/api/v1/parked/{id}", summary: "One parked message (no payload)", role: viewer, resp: ops.ParkedMessage{}, handler: http.HandlerFunc(s.parkedOne)},
		{method: "POST", path: "/api/v1/parked/{id}/reveal", summary: "Reveal one parked message's payload (operator; audited as parked.reveal_payload)", role: operator, action: true, body: RevealRequest{}, resp: RevealResponse{}, handler: http.HandlerFunc(s.revealParked)},
		{method: "POST", path: "/api/v1/parked/replay", summary: "Request replay of parked messages (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[ParkedFilter]{}, resp: ops.ParkedResult{}, handler: parkedAction(s, s.o.RequestReplay)},
		{method: "POST", path: "/api/v1/parked/release-gap", summary: "Release gap-parked messages (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[ParkedFilter]{}, resp: ops.ParkedResult{}, handler: parkedAction(s, s.o.RequestReleaseGap)},
		{method: "GET", path: "/api/v1/effects/failed", summary: "List failed effect intents", role: viewer, query: EffectQuery{}, resp: ops.Page[ops.FailedEffect]{}, handler: http.HandlerFunc(s.effects)},
		{method: "GET", path: "/api/v1/effects/{id}", summary: "One effect intent in any state: attempts, last error, receipt (no request body)", role: viewer, resp: ops.EffectIntent{}, handler: http.HandlerFunc(s.effectOne)},
		{method: "POST", path: "/api/v1/effects/{id}/reveal", summary: "Reveal one effect intent's request body (operator; audited as effects.reveal_request)", role: operator, action: true, body: RevealRequest{}, resp: RevealResponse{}, handler: http.HandlerFunc(s.revealEffect)},
		{method: "POST", path: "/api/v1/effects/requeue", summary: "Requeue failed effect intents (preview, or approve with a reason)", role: operator, action: true, body: ActionRequest[EffectFilter]{}, resp: ops.EffectResult{}, handler: effectAction(s, s.o.RequeueFailedEffects)},
		{method: "POST", path: "/api/v1/cleanup/preview", summary: "Preview a cleanup: what ferry cleanup would delete (never deletes)", role: viewer, body: CleanupRequest{}, resp: ops.CleanupResult{}, handler: http.HandlerFunc(s.cleanupPreview)},
		{method: "GET", path: "/api/v1/evidence", summary: "Evidence of an event id, correlation id or command key, from the tables alone", role: viewer, query: EvidenceQuery{}, resp: EvidenceResponse{}, handler: http.HandlerFunc(s.evidence)},
		{method: "GET", path: "/api/v1/audit", summary: "The audit log, newest first", role: viewer, query: AuditQuery{}, resp: ops.Page[ops.AuditEntry]{}, handler: http.HandlerFunc(s.audit)},
	}
}

func identity(r *http.Request) opsauth.Identity {
	id, _ := opsauth.FromContext(r.Context())
	return id
}

func (s *Server) me(w http.ResponseWriter, r *http.Request) {
	id := identity(r)
	writeJSON(w, Me{Name: id.Name, Role: id.Role, Agent: id.Agent, Source: id.Source, CanAct: id.CanApprove() && !s.cfg.ReadOnly, ReadOnly: s.cfg.ReadOnly})
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	// Counts per shard are bounded: the overview refreshes every few
	// seconds and must not read every one of 100,000 dead letters each time.
	st, err := s.o.Status(r.Context(), ops.WithCountCap(OverviewCountCap))
	resp := StatusResponse{Status: st, ReadAt: time.Now().UTC(), CountCap: OverviewCountCap}
	if err != nil {
		if !errors.Is(err, ops.ErrStatusIncomplete) {
			s.writeError(w, r, err)
			return
		}
		resp.Error = err.Error()
	}
	writeJSON(w, resp)
}

func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	var q SearchQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	oq := ops.OutboxQuery{EventID: q.EventID, TenantID: q.TenantID, AggregateType: q.AggregateType, AggregateID: q.AggregateID,
		CorrelationID: q.CorrelationID, Status: q.Status, Limit: q.Limit, After: q.After}
	var err error
	if oq.Since, err = parseTime("since", q.Since); err == nil {
		oq.Until, err = parseTime("until", q.Until)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := s.o.SearchOutbox(r.Context(), oq)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) message(w http.ResponseWriter, r *http.Request) {
	m, err := s.o.Message(r.Context(), r.PathValue("event_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, m)
}

func (s *Server) reveal(w http.ResponseWriter, r *http.Request) {
	var req RevealRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := identity(r)
	p, err := s.o.RevealPayload(r.Context(), r.PathValue("event_id"), ops.Approval{Approve: true, Actor: id.Name, Reason: req.Reason})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeRevealed(w, p)
}

func writeRevealed(w http.ResponseWriter, p ops.RevealedPayload) {
	resp := RevealResponse{EventID: p.EventID, ContentType: p.ContentType, PayloadBase64: p.Payload, AuditID: p.AuditID,
		Masked: p.Masked, MaskedValues: p.MaskedValues, Withheld: p.Withheld, WithheldReason: p.WithheldReason}
	if utf8.Valid(p.Payload) {
		resp.PayloadText = string(p.Payload)
	}
	writeJSON(w, resp)
}

// pathID reads the {id} path parameter, a row id.
func pathID(r *http.Request, what string) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, &fieldError{"id", "not " + what + " id"}
	}
	return id, nil
}

// revealRow reveals the payload of one row by id (parked message, effect
// intent): an audited action whose actor is the authenticated identity.
func (s *Server) revealRow(w http.ResponseWriter, r *http.Request, what string, fn func(context.Context, int64, ops.Approval) (ops.RevealedPayload, error)) {
	id, err := pathID(r, what)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req RevealRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := fn(r.Context(), id, ops.Approval{Approve: true, Actor: identity(r).Name, Reason: req.Reason})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeRevealed(w, p)
}

func (s *Server) revealParked(w http.ResponseWriter, r *http.Request) {
	s.revealRow(w, r, "a parked message", s.o.RevealParkedPayload)
}

func (s *Server) revealEffect(w http.ResponseWriter, r *http.Request) {
	s.revealRow(w, r, "an effect intent", s.o.RevealEffectRequest)
}

func (s *Server) effectOne(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "an effect intent")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	e, err := s.o.Effect(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, e)
}

func (s *Server) dead(w http.ResponseWriter, r *http.Request) {
	var q DeadQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	f, err := q.OutboxFilter.ops()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f.After = q.After
	p, err := s.o.ListDeadPage(r.Context(), f, q.IncludeDiscarded)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) parked(w http.ResponseWriter, r *http.Request) {
	var q ParkedQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	f, err := q.ParkedFilter.ops()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f.After, f.IncludeResolved = q.After, q.IncludeResolved
	p, err := s.o.ListParkedPage(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) parkedOne(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "a parked message")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	m, err := s.o.Parked(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, m)
}

func (s *Server) effects(w http.ResponseWriter, r *http.Request) {
	var q EffectQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	f := q.EffectFilter.ops()
	f.After = q.After
	p, err := s.o.ListFailedEffectsPage(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, p)
}

func (s *Server) cleanupPreview(w http.ResponseWriter, r *http.Request) {
	var req CleanupRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var opts ops.CleanupOptions
	var err error
	if opts.Retention, err = parseDuration("retention", req.Retention); err == nil {
		if opts.InboxRetention, err = parseDuration("inbox_retention", req.InboxRetention); err == nil {
			opts.EffectRetention, err = parseDuration("effect_retention", req.EffectRetention)
		}
	}
	if err == nil && opts.Retention == 0 {
		err = &fieldError{"retention", "required, e.g. 720h"}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	opts.IncludeDiscarded = req.IncludeDiscarded
	res, err := s.o.Cleanup(r.Context(), opts, ops.Approval{}) // never approved: a preview
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, res)
}

func (s *Server) evidence(w http.ResponseWriter, r *http.Request) {
	var q EvidenceQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	kind := ops.EvidenceKind(q.Kind)
	if q.Kind == "auto" {
		kind = ops.KindAuto
	}
	ev, err := s.o.Evidence(r.Context(), q.Q, kind)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, EvidenceResponse{Evidence: ev, Timeline: s.timeline(ev)})
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	var q AuditQuery
	if err := fromQuery(r, &q); err != nil {
		s.writeError(w, r, err)
		return
	}
	f := ops.AuditFilter{Actor: q.Actor, Action: q.Action, Limit: q.Limit, After: q.After}
	var err error
	if f.Since, err = parseTime("since", q.Since); err == nil {
		f.Until, err = parseTime("until", q.Until)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := s.o.AuditPage(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, p)
}

// runAction decodes an ActionRequest, builds the approval from the
// authenticated identity and runs it.
func runAction[F any, R any](s *Server, w http.ResponseWriter, r *http.Request, conv func(F) (any, error), run func(ctx context.Context, f any, a ops.Approval) (R, error)) {
	var req ActionRequest[F]
	if err := decodeBody(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := identity(r)
	if req.Approve && !id.CanApprove() {
		opsauth.WriteProblem(w, http.StatusForbidden, "forbidden", id.Name+" may not approve actions", "approve")
		return
	}
	f, err := conv(req.Filter)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := run(r.Context(), f, ops.Approval{Approve: req.Approve, Actor: id.Name, Reason: req.Reason})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, res)
}

func outboxAction(s *Server, fn func(context.Context, ops.Filter, ops.Approval) (ops.Result, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runAction(s, w, r, func(f OutboxFilter) (any, error) { return f.ops() },
			func(ctx context.Context, f any, a ops.Approval) (ops.Result, error) {
				return fn(ctx, f.(ops.Filter), a)
			})
	})
}

func parkedAction(s *Server, fn func(context.Context, ops.ParkedFilter, ops.Approval) (ops.ParkedResult, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runAction(s, w, r, func(f ParkedFilter) (any, error) { return f.ops() },
			func(ctx context.Context, f any, a ops.Approval) (ops.ParkedResult, error) {
				return fn(ctx, f.(ops.ParkedFilter), a)
			})
	})
}

func effectAction(s *Server, fn func(context.Context, ops.EffectFilter, ops.Approval) (ops.EffectResult, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runAction(s, w, r, func(f EffectFilter) (any, error) { return f.ops(), nil },
			func(ctx context.Context, f any, a ops.Approval) (ops.EffectResult, error) {
				return fn(ctx, f.(ops.EffectFilter), a)
			})
	})
}

func (f OutboxFilter) ops() (ops.Filter, error) {
	out := ops.Filter{EventIDs: f.EventIDs, Topic: f.Topic, TenantID: f.TenantID, AggregateType: f.AggregateType, AggregateID: f.AggregateID,
		EventType: f.EventType, ErrorContains: f.ErrorContains, All: f.All, Limit: f.Limit}
	var err error
	if out.OlderThan, err = parseDuration("filter.older_than", f.OlderThan); err != nil {
		return out, err
	}
	if out.Since, err = parseTime("filter.since", f.Since); err != nil {
		return out, err
	}
	out.Until, err = parseTime("filter.until", f.Until)
	return out, err
}

func (f ParkedFilter) ops() (ops.ParkedFilter, error) {
	out := ops.ParkedFilter{IDs: f.IDs, EventIDs: f.EventIDs, Consumer: f.Consumer, Reason: f.Reason, TenantID: f.TenantID,
		AggregateType: f.AggregateType, AggregateID: f.AggregateID, EventType: f.EventType, All: f.All, Limit: f.Limit}
	var err error
	out.OlderThan, err = parseDuration("filter.older_than", f.OlderThan)
	return out, err
}

func (f EffectFilter) ops() ops.EffectFilter {
	return ops.EffectFilter{Keys: f.Keys, Consumer: f.Consumer, Target: f.Target, TenantID: f.TenantID, ErrorContains: f.ErrorContains, All: f.All, Limit: f.Limit}
}

func parseTime(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, &fieldError{field, "an RFC 3339 time, e.g. 2026-01-02T15:04:05Z"}
	}
	return t, nil
}

func parseDuration(field, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, &fieldError{field, "a duration >= 0 such as 30m or 72h"}
	}
	return d, nil
}

// decodeBody reads one JSON object, refusing unknown fields and trailing
// data; a body over the limit is a 413.
func decodeBody(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return &fieldError{"body", "Content-Type must be application/json"}
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return mbe
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" {
			return &fieldError{ute.Field, fmt.Sprintf("must be a %s", ute.Type)}
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return &fieldError{strings.Trim(f, `"`), "unknown field"}
		}
		return &fieldError{"body", "not a JSON object: " + err.Error()}
	}
	if dec.More() {
		return &fieldError{"body", "one JSON object expected"}
	}
	return nil
}

// fromQuery sets v's json-tagged fields (string, int, int64, bool,
// []string, []int64; embedded structs flattened) from the URL query;
// unknown parameters are refused, naming them.
func fromQuery(r *http.Request, v any) error {
	q := r.URL.Query()
	known := map[string]bool{}
	var set func(rv reflect.Value) error
	set = func(rv reflect.Value) error {
		rt := rv.Type()
		for i := range rt.NumField() {
			sf, fv := rt.Field(i), rv.Field(i)
			if sf.Anonymous {
				if err := set(fv); err != nil {
					return err
				}
				continue
			}
			name := jsonName(sf)
			if name == "" {
				continue
			}
			known[name] = true
			vals, ok := q[name]
			if !ok || len(vals) == 0 {
				continue
			}
			bad := func(want string) error { return &fieldError{name, "must be " + want} }
			switch fv.Kind() {
			case reflect.String:
				fv.SetString(vals[0])
			case reflect.Int, reflect.Int64:
				if vals[0] == "" {
					continue
				}
				n, err := strconv.ParseInt(vals[0], 10, 64)
				if err != nil {
					return bad("an integer")
				}
				fv.SetInt(n)
			case reflect.Bool:
				if vals[0] == "" {
					continue
				}
				b, err := strconv.ParseBool(vals[0])
				if err != nil {
					return bad("true or false")
				}
				fv.SetBool(b)
			case reflect.Slice:
				var parts []string
				for _, v := range vals {
					for p := range strings.SplitSeq(v, ",") {
						if p = strings.TrimSpace(p); p != "" {
							parts = append(parts, p)
						}
					}
				}
				sl := reflect.MakeSlice(fv.Type(), 0, len(parts))
				for _, p := range parts {
					if fv.Type().Elem().Kind() == reflect.String {
						sl = reflect.Append(sl, reflect.ValueOf(p))
						continue
					}
					n, err := strconv.ParseInt(p, 10, 64)
					if err != nil {
						return bad("comma-separated integers")
					}
					sl = reflect.Append(sl, reflect.ValueOf(n))
				}
				fv.Set(sl)
			}
		}
		return nil
	}
	if err := set(reflect.ValueOf(v).Elem()); err != nil {
		return err
	}
	for k := range q {
		if !known[k] {
			return &fieldError{k, "unknown query parameter"}
		}
	}
	return nil
}

func jsonName(sf reflect.StructField) string {
	tag := sf.Tag.Get("json")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" || !sf.IsExported() {
		return ""
	}
	if name == "" {
		return sf.Name
	}
	return name
}
