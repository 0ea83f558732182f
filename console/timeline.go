package console

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// timeline renders ev as lines in time order (lines without a time keep
// their place after the timed ones of their event), each naming the table
// it was read from. It only rearranges what ops.Evidence read.
func (s *Server) timeline(ev ops.Evidence) []TimelineLine {
	tbl := func(base string) string { return strings.ReplaceAll(s.cfg.Tables.Name(base), `"`, "") }
	out := []TimelineLine{}
	if c := ev.Command; c != nil {
		at := c.CreatedAt
		out = append(out, TimelineLine{At: &at, Step: "command", Source: tbl("command_keys"),
			Text: fmt.Sprintf("command key %s (tenant %s) stored, expires %s, events %s", c.Key, c.TenantID, c.ExpiresAt.Format(time.RFC3339), strings.Join(c.EventIDs, ", "))})
	}
	for _, e := range ev.Events {
		var lines []TimelineLine
		add := func(at *time.Time, step, source, text string) {
			lines = append(lines, TimelineLine{EventID: e.EventID, At: at, Step: step, Source: source, Text: text})
		}
		if c := e.Committed; c != nil {
			at := c.At
			add(&at, "committed", tbl("outbox"), fmt.Sprintf("committed: tenant %s, %s/%s seq %d, %s v%d on topic %s, principal %q, correlation %q",
				c.TenantID, c.AggregateType, c.AggregateID, c.AggregateSeq, c.EventType, c.SchemaVersion, c.Topic, c.Principal, c.CorrelationID))
		} else {
			add(nil, "committed", tbl("outbox"), "no outbox row (never written here, or deleted by cleanup)")
		}
		if p := e.Published; p != nil {
			text := fmt.Sprintf("status %s, broker %s, published %d time(s), %d failed attempt(s)", p.Status, p.Broker, p.Publications, p.Attempts)
			if p.Receipt != "" {
				text += ", receipt " + p.Receipt
			}
			if p.LastError != "" {
				text += ", last error: " + p.LastError
			}
			if p.UnknownReason != "" {
				text += " (" + p.UnknownReason + ")"
			}
			add(p.PublishedAt, "published", tbl("outbox"), text)
			if p.Discarded != nil {
				add(p.Discarded, "discarded", tbl("outbox"), "dead letter discarded (kept as evidence)")
			}
		}
		for _, a := range e.Applied {
			at := a.AppliedAt
			add(&at, "applied", tbl("inbox"), fmt.Sprintf("applied by consumer %s (tenant %s)", a.Consumer, a.TenantID))
		}
		for _, p := range e.Parked {
			at := p.FirstSeen
			state := "open"
			if p.ResolvedAt != nil {
				state = "resolved (" + p.Resolution + ") at " + p.ResolvedAt.Format(time.RFC3339)
			}
			add(&at, "parked", tbl("inbox_parked"), fmt.Sprintf("parked by consumer %s as %s after %d attempt(s), %s; last error: %s", p.Consumer, p.Reason, p.Attempts, state, p.LastError))
		}
		for _, x := range e.Effects {
			at := x.CreatedAt
			add(&at, "effect", tbl("effects"), fmt.Sprintf("effect %s/%s %s %s: %s, provider operation id %q, %d attempt(s), %d reconciliation(s)",
				x.Consumer, x.Step, x.Target, x.Operation, x.State, x.OperationID, x.Attempts, x.Reconciliations))
		}
		for _, a := range e.Audit {
			at := a.At
			add(&at, "audit", tbl("ops_audit"), fmt.Sprintf("audit #%d %s by %s: %s", a.ID, a.Action, a.Actor, a.Reason))
		}
		sort.SliceStable(lines, func(i, j int) bool {
			if lines[i].At == nil || lines[j].At == nil {
				return false
			}
			return lines[i].At.Before(*lines[j].At)
		})
		out = append(out, lines...)
	}
	return out
}
