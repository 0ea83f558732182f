package opsmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/opsmcp"
	"github.com/ferryhq/ferry/outbox"
)

// TestMCPToolsNeverShowPayloads: the MCP tools carry payload sizes, never
// payloads. Every tool an agent can call in a session (status, evidence,
// find_events, list_dead, list_parked, list_effects, preview_action,
// request_action, list_approvals) and the server's logs are searched for
// canary values held in an outbox payload, a parked payload and an effect
// request; the rows themselves must show (their ids), so the search is not
// over empty answers. The canaries are readable in the tables (checked),
// so a tool that passed a payload through would fail this test.
func TestMCPToolsNeverShowPayloads(t *testing.T) {
	const (
		canaryOut    = "CANARY-email-7f3a@x"
		canaryParked = "CANARY-parked-c0de"
		canaryEffect = "CANARY-memo-e5d0"
	)
	ctx := context.Background()
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := w.Insert(ctx, ferry.Event{TenantID: "shop", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1,
		Payload: []byte(`{"customer":{"email":"` + canaryOut + `"}}`), Headers: ferry.Headers{CorrelationID: "corr-mask"}})
	if err != nil {
		t.Fatal(err)
	}
	id := evs[0].ID.String()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := drv.Executor().Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`UPDATE ferry_outbox SET status = 'dead', attempts = 25, last_error = 'broker rejected' WHERE event_id = $1`, id)
	now := time.Now().UTC().Truncate(time.Second)
	exec(`INSERT INTO ferry_inbox_parked (consumer, reason, park_key, attempts, first_seen, last_seen, last_error, tenant_id, event_id,
    aggregate_type, aggregate_id, aggregate_seq, event_type, content_type, payload)
VALUES ('billing', 'poison', 'mask-1', 3, $1, $1, 'handler failed', 'shop', $2, 'order', 'o-1', 1, 'order.created', 'application/json', $3)`,
		now, id, []byte(`{"note":"`+canaryParked+`"}`))
	exec(`INSERT INTO ferry_effects (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha, state,
    attempts, next_attempt_at, last_error, created_at, updated_at)
VALUES ('mask-key-1', 'billing', $1, 'charge', 'shop', 'psp', 'charge', $2, $3, 'failed', 4, $4, 'declined', $4, $4)`,
		id, []byte(`{"memo":"`+canaryEffect+`"}`), []byte{0}, now)

	// Control: the canaries are in the tables, readable by a reveal.
	o0, err := ops.New(drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := o0.RevealPayload(ctx, id, ops.Approval{Approve: true, Actor: "test", Reason: "control"}); err != nil || !bytes.Contains(r.Payload, []byte(canaryOut)) {
		t.Fatalf("control reveal: %s %v", r.Payload, err)
	}

	var log testenv.Buffer
	logger := slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o, err := ops.New(drv, ops.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := opsmcp.New(opsmcp.Config{Ops: o, Tables: ferry.Tables{}, Logger: logger, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	agent := opsauth.Identity{Name: "claude", Role: opsauth.RoleOperator, Agent: true, Source: "local"}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.MCP(&agent).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := newClient().Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	tools := listTools(t, cs)

	var all strings.Builder
	raw := func(name string, args map[string]any) map[string]any {
		t.Helper()
		if tools[name] == nil {
			t.Fatalf("no tool %s", name)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("%s: %s", name, errText(res))
		}
		all.Write(b)
		all.WriteString("\n")
		var out map[string]any
		if sc, err := json.Marshal(res.StructuredContent); err == nil {
			_ = json.Unmarshal(sc, &out)
		}
		return out
	}
	raw("status", map[string]any{})
	raw("evidence", map[string]any{"event_id": id})
	raw("evidence", map[string]any{"correlation_id": "corr-mask"})
	raw("evidence", map[string]any{"aggregate_type": "order", "aggregate_id": "o-1"})
	raw("find_events", map[string]any{"event_id": id})
	raw("find_events", map[string]any{"aggregate_type": "order", "aggregate_id": "o-1"})
	raw("list_dead", map[string]any{})
	raw("list_parked", map[string]any{})
	raw("list_effects", map[string]any{})
	prev := raw("preview_action", map[string]any{"action": "dlq.retry", "event_ids": []string{id}})
	hash, _ := prev["plan_hash"].(string)
	if hash == "" {
		t.Fatalf("preview_action: no plan_hash: %v", prev)
	}
	raw("request_action", map[string]any{"plan_hash": hash, "reason": "retry after the fix"})
	raw("list_approvals", map[string]any{})
	raw("preview_action", map[string]any{"action": "parked.replay", "event_ids": []string{id}})
	raw("preview_action", map[string]any{"action": "effects.requeue", "keys": []string{"mask-key-1"}})

	out := all.String()
	for _, want := range []string{id, "mask-key-1", "billing", "payload_bytes"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the tools do not describe the rows (%q missing): the canary search would be vacuous:\n%s", want, out)
		}
	}
	logs := log.String()
	if !strings.Contains(logs, "ferry mcp: action requested") {
		t.Fatalf("the server logged nothing: the log search would be vacuous: %s", logs)
	}
	for _, c := range []string{canaryOut, canaryParked, canaryEffect} {
		if strings.Contains(out, c) {
			t.Fatalf("an MCP tool shows payload canary %q:\n%s", c, out)
		}
		if strings.Contains(logs, c) {
			t.Fatalf("the MCP server logs payload canary %q:\n%s", c, logs)
		}
	}
}
