package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

var (
	agentID  = opsauth.Identity{Name: "claude", Role: opsauth.RoleOperator, Agent: true, Source: "token"}
	humanID  = opsauth.Identity{Name: "alice", Role: opsauth.RoleOperator, Source: "token"}
	viewerID = opsauth.Identity{Name: "vera", Role: opsauth.RoleViewer, Source: "token"}
)

// TestApprovalFlow: an agent previews a retry of dead letters and requests
// it; the agent cannot approve (its own request); a viewer cannot request;
// a human approves and exactly the planned rows are retried; every step is
// audited.
func TestApprovalFlow(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"), event("3", "order.paid"))
		markDead(t, e, evs[0].ID.String(), evs[1].ID.String(), evs[2].ID.String())
		spec := ops.ActionSpec{Action: ops.ActionRetryDead, Outbox: &ops.Filter{EventType: "order.created"}}
		before := snapshot(t, e, "outbox")
		plan, err := e.ops.PreviewPlan(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Rows != 2 || len(plan.Plan) != 2 || !strings.HasPrefix(plan.Hash, "sha256:") || plan.More {
			t.Fatalf("plan %+v", plan)
		}
		if snapshot(t, e, "outbox") != before {
			t.Fatal("preview changed the outbox")
		}
		again, _ := e.ops.PreviewPlan(ctx, spec)
		if again.Hash != plan.Hash {
			t.Fatalf("plan hash not stable: %s vs %s", plan.Hash, again.Hash)
		}

		if _, err := e.ops.RequestAction(ctx, plan, viewerID, "retry", nil); !errors.Is(err, opsauth.ErrForbidden) {
			t.Fatalf("viewer request: err %v, want ErrForbidden", err)
		}
		req, err := e.ops.RequestAction(ctx, plan, agentID, "the schema registry is fixed (INC-7)", nil)
		if err != nil {
			t.Fatal(err)
		}
		if req.Status != ops.ApprovalPending || req.RequestedBy != "claude" || !req.RequestedAgent || req.Rows != 2 {
			t.Fatalf("request %+v", req)
		}
		if _, err := e.ops.ApproveRequest(ctx, req.ID, agentID, "I approve my own"); !errors.Is(err, ops.ErrNotApprovable) || !errors.Is(err, opsauth.ErrForbidden) {
			t.Fatalf("agent approve: err %v, want ErrNotApprovable", err)
		}
		if snapshot(t, e, "outbox") != before {
			t.Fatal("a refused approval changed the outbox")
		}
		done, err := e.ops.ApproveRequest(ctx, req.ID, humanID, "checked the registry")
		if err != nil {
			t.Fatal(err)
		}
		if done.Status != ops.ApprovalExecuted || done.DecidedBy != "alice" || done.AuditID == nil {
			t.Fatalf("approved request %+v", done)
		}
		for i, ev := range evs {
			m, err := e.ops.Message(ctx, ev.ID.String())
			if err != nil {
				t.Fatal(err)
			}
			want := "pending"
			if i == 2 {
				want = "dead"
			}
			if m.Status != want {
				t.Fatalf("event %d status %s, want %s", i, m.Status, want)
			}
		}
		if _, err := e.ops.ApproveRequest(ctx, req.ID, humanID, "twice"); !errors.Is(err, ops.ErrAlreadyDecided) {
			t.Fatalf("second approval: err %v, want ErrAlreadyDecided", err)
		}
		var actions []string
		audit, err := e.ops.Audit(ctx, 20)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(audit) - 1; i >= 0; i-- {
			actions = append(actions, audit[i].Actor+":"+audit[i].Action)
		}
		got := strings.Join(actions, ",")
		if want := "claude:approval.request,claude:approval.approve_refused,alice:approval.approve,alice:dlq.retry"; got != want {
			t.Fatalf("audit trail %s, want %s", got, want)
		}
	})
}

// TestApprovalRefusedWhenRowsChanged: a row of the plan changes between
// the request and the approval (the relay retried it, or someone else did):
// approval refuses, names the row, and changes nothing. Removing the hash
// check would retry a row nobody previewed.
func TestApprovalRefusedWhenRowsChanged(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"))
		markDead(t, e, evs[0].ID.String())
		spec := ops.ActionSpec{Action: ops.ActionRetryDead, Outbox: &ops.Filter{EventType: "order.created"}}
		plan, err := e.ops.PreviewPlan(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		req, err := e.ops.RequestAction(ctx, plan, agentID, "retry the one dead letter", nil)
		if err != nil {
			t.Fatal(err)
		}
		// A second row goes dead after the preview: the same filter now
		// matches a row nobody previewed.
		markDead(t, e, evs[1].ID.String())
		before := snapshot(t, e, "outbox")
		_, err = e.ops.ApproveRequest(ctx, req.ID, humanID, "ok")
		var pc *ops.PlanChangedError
		if !errors.As(err, &pc) || len(pc.Diff.Added) != 1 || pc.Diff.Added[0].Key != evs[1].ID.String() {
			t.Fatalf("approve after change: err %v, want PlanChangedError naming %s as added", err, evs[1].ID)
		}
		if !strings.Contains(err.Error(), evs[1].ID.String()) {
			t.Fatalf("error does not name the row: %v", err)
		}
		if snapshot(t, e, "outbox") != before {
			t.Fatal("a refused approval changed the outbox")
		}
		got, _ := e.ops.GetApproval(ctx, req.ID)
		if got.Status != ops.ApprovalRefused || !strings.Contains(got.Result, evs[1].ID.String()) {
			t.Fatalf("request after refusal %+v", got)
		}

		// A changed state (attempts) is named as changed.
		plan2, _ := e.ops.PreviewPlan(ctx, spec)
		req2, err := e.ops.RequestAction(ctx, plan2, agentID, "retry both", nil)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET attempts = 9 WHERE event_id = $1`, tn("outbox")), evs[0].ID.String())
		_, err = e.ops.ApproveRequest(ctx, req2.ID, humanID, "ok")
		if !errors.As(err, &pc) || len(pc.Diff.Changed) != 1 || !strings.Contains(pc.Diff.Changed[0].After, "attempts=9") {
			t.Fatalf("approve after state change: err %v", err)
		}
		// A stale plan cannot even be requested.
		if _, err := e.ops.RequestAction(ctx, plan2, agentID, "stale", nil); !errors.Is(err, ops.ErrPlanChanged) {
			t.Fatalf("stale request: err %v, want ErrPlanChanged", err)
		}
		// Rejection: not by an agent; by a human, and nothing runs.
		plan3, _ := e.ops.PreviewPlan(ctx, spec)
		req3, err := e.ops.RequestAction(ctx, plan3, agentID, "retry both", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ops.RejectRequest(ctx, req3.ID, agentID, "withdraw"); !errors.Is(err, ops.ErrNotApprovable) {
			t.Fatalf("agent reject: %v", err)
		}
		before = snapshot(t, e, "outbox")
		rej, err := e.ops.RejectRequest(ctx, req3.ID, humanID, "not now")
		if err != nil || rej.Status != ops.ApprovalRejected || snapshot(t, e, "outbox") != before {
			t.Fatalf("reject: %+v %v (or the outbox changed)", rej, err)
		}

		// Control: an approval without the plan check would run the first
		// request's filter as is — which now retries 2 rows, one of which
		// that request's plan (1 row) never covered.
		res, err := e.ops.RetryDead(ctx, *spec.Outbox, approve)
		if err != nil || res.Rows != 2 {
			t.Fatalf("control: %+v %v, want the 2 rows the filter matches now (1 of them never previewed)", res, err)
		}
	})
}

// TestApprovalPolicy: a policy auto-approves retries of one topic up to
// max_rows; one row more needs a human, as does another topic.
func TestApprovalPolicy(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		pol, err := ops.ParsePolicy([]byte("rules:\n  - name: retry-orders\n    action: dlq.retry\n    topic: order.events\n    max_rows: 2\n"))
		if err != nil {
			t.Fatal(err)
		}
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"), event("3", "order.created"))
		markDead(t, e, evs[0].ID.String(), evs[1].ID.String(), evs[2].ID.String())
		m, _ := e.ops.Message(ctx, evs[0].ID.String())
		if m.Topic != "order.events" {
			t.Fatalf("topic %q", m.Topic)
		}
		three, _ := e.ops.PreviewPlan(ctx, ops.ActionSpec{Action: ops.ActionRetryDead, Outbox: &ops.Filter{Topic: "order.events"}})
		req, err := e.ops.RequestAction(ctx, three, agentID, "retry 3", pol)
		if err != nil {
			t.Fatal(err)
		}
		if req.Status != ops.ApprovalPending || three.Rows != 3 {
			t.Fatalf("3 rows with max_rows 2: %+v, want pending (needs a human)", req)
		}
		two, _ := e.ops.PreviewPlan(ctx, ops.ActionSpec{Action: ops.ActionRetryDead, Outbox: &ops.Filter{Topic: "order.events", EventIDs: []string{evs[0].ID.String(), evs[1].ID.String()}}})
		req2, err := e.ops.RequestAction(ctx, two, agentID, "retry 2", pol)
		if err != nil {
			t.Fatal(err)
		}
		if req2.Status != ops.ApprovalExecuted || req2.DecidedBy != "policy:retry-orders" || req2.RequestedBy != "claude" {
			t.Fatalf("2 rows: %+v, want executed by policy", req2)
		}
		if m, _ := e.ops.Message(ctx, evs[0].ID.String()); m.Status != "pending" {
			t.Fatalf("policy-approved row status %s", m.Status)
		}
		for _, bad := range []string{"rules:\n  - name: x\n    action: dlq.discard\n    max_rows: 1\n", "rules:\n  - name: x\n    action: dlq.retry\n    max_rows: 0\n", "rules:\n  - name: x\n    action: dlq.retry\n    max_rows: 1\n    bogus: 1\n"} {
			if _, err := ops.ParsePolicy([]byte(bad)); !errors.Is(err, ops.ErrInvalidArgument) {
				t.Fatalf("policy %q: err %v", bad, err)
			}
		}
	})
}
