package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/driver"
)

// seedDetailRows inserts one poison-parked message of ev (for consumer
// billing) and one failed effect intent of ev, both with an error text and
// a payload that hold markup, and returns their ids.
func seedDetailRows(t testing.TB, e *env, ev ferry.Event) (parkedID, effectID int64) {
	t.Helper()
	mustExec(t, e, `INSERT INTO ferry_inbox_parked (consumer, reason, park_key, attempts, first_seen, last_seen, last_error, tenant_id, event_id,
    aggregate_type, aggregate_id, aggregate_seq, event_type, content_type, payload)
VALUES ('billing', 'poison', 'detail-1', 3, $1, $1, $2, 'acme', $3, 'order', $4, 1, 'order.created', 'application/json', $5)`,
		ev.OccurredAt, `handler panicked: <img src=x onerror="window.__xss=1">`, ev.ID.String(), ev.AggregateID, []byte(`{"note":"<script>window.__xss=2</script>"}`))
	mustExec(t, e, `INSERT INTO ferry_effects (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha, state,
    attempts, next_attempt_at, operation_id, response_summary, last_error, created_at, updated_at, completed_at)
VALUES ('detail-key-1', 'billing', $1, 'charge', 'acme', 'psp', 'charge', $2, $3, 'failed', 4, $4, 'op-77', 'declined', $5, $4, $4, $4)`,
		ev.ID.String(), []byte(`{"amount":100,"memo":"<script>window.__xss=3</script>"}`), []byte{0}, ev.OccurredAt, `psp said <b onmouseover="window.__xss=4">no</b>`)
	return count(t, e, `SELECT id FROM ferry_inbox_parked WHERE park_key = 'detail-1'`),
		count(t, e, `SELECT id FROM ferry_effects WHERE idem_key = 'detail-key-1'`)
}

// TestDetailEndpoints: the parked and effect detail endpoints return the
// row without its payload; revealing one is an operator action with a
// required reason, written to the audit log under the authenticated name
// with the row id; a viewer is refused.
func TestDetailEndpoints(t *testing.T) {
	both(t, console.Config{}, func(t *testing.T, e *env) {
		evs := e.insert(t, event("o-9", "order.created"))
		pid, fid := seedDetailRows(t, e, evs[0])

		code, b, _ := call(t, e, "GET", fmt.Sprintf("/api/v1/effects/%d", fid), viewerToken, nil)
		var fx map[string]any
		if err := json.Unmarshal(b, &fx); code != 200 || err != nil {
			t.Fatalf("effect: %d %s %v", code, b, err)
		}
		if fx["state"] != "failed" || fx["operation_id"] != "op-77" || fx["attempts"] != float64(4) || fx["event_id"] != evs[0].ID.String() || fx["request_bytes"] == float64(0) {
			t.Fatalf("effect detail: %s", b)
		}
		if _, ok := fx["request"]; ok {
			t.Fatalf("effect detail carries the request body: %s", b)
		}
		code, b, _ = call(t, e, "GET", fmt.Sprintf("/api/v1/parked/%d", pid), viewerToken, nil)
		if code != 200 || !json.Valid(b) {
			t.Fatalf("parked: %d %s", code, b)
		}

		for _, c := range []struct{ path, action, want string }{
			{fmt.Sprintf("/api/v1/parked/%d/reveal", pid), "parked.reveal_payload", `{"note":"<script>window.__xss=2</script>"}`},
			{fmt.Sprintf("/api/v1/effects/%d/reveal", fid), "effects.reveal_request", `{"amount":100,"memo":"<script>window.__xss=3</script>"}`},
		} {
			before := count(t, e, `SELECT count(*) FROM ferry_ops_audit WHERE action = $1`, c.action)
			if code, b, _ := call(t, e, "POST", c.path, viewerToken, map[string]any{"reason": "curious"}); code != 403 {
				t.Fatalf("%s as viewer: %d %s", c.path, code, b)
			}
			code, b, _ := call(t, e, "POST", c.path, operatorToken, map[string]any{})
			if code != 400 || problem(t, b).Field != "reason" {
				t.Fatalf("%s without reason: %d %s", c.path, code, b)
			}
			if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit WHERE action = $1`, c.action); n != before {
				t.Fatalf("%s: refused reveals wrote %d audit rows", c.path, n-before)
			}
			code, b, _ = call(t, e, "POST", c.path, operatorToken, map[string]any{"reason": "ticket 42"})
			var r console.RevealResponse
			if err := json.Unmarshal(b, &r); code != 200 || err != nil || r.PayloadText != c.want || r.AuditID == 0 {
				t.Fatalf("%s: %d %s %v", c.path, code, b, err)
			}
			var actor, reason string
			if found, err := driver.QueryRow(context.Background(), e.exec, `SELECT actor, reason FROM ferry_ops_audit WHERE id = $1 AND action = $2`, []any{r.AuditID, c.action}, &actor, &reason); err != nil || !found || actor != "olivia" || reason != "ticket 42" {
				t.Fatalf("%s audit row %d: actor %q reason %q, %v", c.path, r.AuditID, actor, reason, err)
			}
		}
		if code, b, _ := call(t, e, "GET", "/api/v1/effects/0", viewerToken, nil); code != 400 || problem(t, b).Field != "id" {
			t.Fatalf("effect id 0: %d %s", code, b)
		}
	})
}
