package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
)

// ferry effects failed|requeue through the CLI: list, preview, refuse
// without a filter or a reason, act with --approve, audit.
func TestEffectsCommandsCLI(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	for i, target := range []string{"payments", "mail"} {
		if _, err := s.Pool.Exec(ctx, `INSERT INTO ferry_effects (idem_key, consumer, event_id, step, tenant_id, target, operation,
			request, request_sha, state, attempts, next_attempt_at, last_error, created_at, updated_at, completed_at)
			VALUES ($1, 'billing', gen_random_uuid(), 'charge', 'acme', $2, 'charge', '\x00', '\x00', 'failed', 5, now(), 'not sent: connection refused', now(), now(), now())`,
			[]string{"fx1_a", "fx1_b"}[i], target); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCLI(t, "effects", "failed", "--database-url", s.URL)
	if err != nil || !strings.Contains(out, "2 failed effect(s)") || !strings.Contains(out, "fx1_a") || !strings.Contains(out, "connection refused") {
		t.Fatalf("failed: %v\n%s", err, out)
	}
	out, err = runCLI(t, "effects", "failed", "--database-url", s.URL, "--target", "payments", "--json")
	var page ops.Page[ops.FailedEffect]
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Rows) != 1 || page.Rows[0].Key != "fx1_a" || page.Total != 1 {
		t.Fatalf("failed --json: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "effects", "requeue", "--database-url", s.URL, "--approve", "--reason", "x"); err == nil {
		t.Fatalf("requeue without a filter succeeded:\n%s", out)
	}
	if out, err := runCLI(t, "effects", "requeue", "--database-url", s.URL, "--key", "fx1_a", "--approve"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("requeue without --reason: %v\n%s", err, out)
	}
	out, err = runCLI(t, "effects", "requeue", "--database-url", s.URL, "--key", "fx1_a")
	if err != nil || !strings.Contains(out, "DRY RUN effects.requeue: 1 intent(s)") {
		t.Fatalf("preview: %v\n%s", err, out)
	}
	out, err = runCLI(t, "effects", "requeue", "--database-url", s.URL, "--key", "fx1_a", "--approve", "--reason", "outage over", "--actor", "carol")
	if err != nil || !strings.Contains(out, "1 intent(s) requeued (audit #") {
		t.Fatalf("requeue: %v\n%s", err, out)
	}
	var state, lastErr string
	if err := s.Pool.QueryRow(ctx, `SELECT state, last_error FROM ferry_effects WHERE idem_key = 'fx1_a'`).Scan(&state, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state != "pending" || !strings.HasPrefix(lastErr, "requeued (audit ") {
		t.Fatalf("fx1_a after requeue: state %s, last_error %q", state, lastErr)
	}
	if err := s.Pool.QueryRow(ctx, `SELECT state FROM ferry_effects WHERE idem_key = 'fx1_b'`).Scan(&state); err != nil || state != "failed" {
		t.Fatalf("fx1_b: %s %v; want still failed", state, err)
	}
	var actor, action string
	if err := s.Pool.QueryRow(ctx, `SELECT actor, action FROM ferry_ops_audit ORDER BY id DESC LIMIT 1`).Scan(&actor, &action); err != nil ||
		actor != "carol" || action != "effects.requeue" {
		t.Fatalf("audit: %s %s %v", actor, action, err)
	}
}
