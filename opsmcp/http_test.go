package opsmcp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/opsmcp"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// TestHTTPApprovalFlow runs the streamable HTTP transport with bearer
// tokens on Postgres, with a relay publishing to the embedded JetStream:
// no token → 401; a viewer cannot request an action; an agent previews a
// retry of two dead letters (more than the policy's one-row limit, so a
// human must approve) and requests it under its token's identity; the
// agent's own approval is refused; `ferry approvals approve` by a human
// executes exactly the plan and the relay publishes both rows; a plan
// whose row changed after the preview is refused with the difference; a
// one-row retry within the policy is approved by the policy at once.
func TestHTTPApprovalFlow(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		pg := testenv.NewPostgresSchema(t)
		httpApprovalFlow(t, pgxv5.New(pg.Pool), pg.URL)
	})
	t.Run("mysql", func(t *testing.T) {
		d := testenv.NewMySQLDatabase(t)
		httpApprovalFlow(t, mysql.New(d.DB), d.URL)
	})
}

// storeDriver is a Ferry driver the relay and ops also take.
type storeDriver[TTx any] interface {
	driver.Driver[TTx]
	Begin(ctx context.Context) (driver.Tx, error)
}

func httpApprovalFlow[TTx any, D storeDriver[TTx]](t *testing.T, drv D, dbURL string) {
	bin := ferryBinary(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	var evs []ferry.Event
	for i := range 4 {
		e, err := w.Insert(ctx, ferry.Event{TenantID: "shop", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "order.placed",
			SchemaVersion: 1, Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e...)
	}
	for _, e := range evs {
		if _, err := drv.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'dead', attempts = 25, last_error = 'no stream captured the subject' WHERE event_id = $1`, e.ID.String()); err != nil {
			t.Fatal(err)
		}
	}
	status := func(id string) string {
		var s string
		if _, err := driver.QueryRow(ctx, drv.Executor(), `SELECT status FROM ferry_outbox WHERE event_id = $1`, []any{id}, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}}); err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(drv, pub, relay.WithPollInterval(20*time.Millisecond), relay.WithLogger(slog.New(slog.DiscardHandler)), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- r.Run(rctx) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-rdone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})

	tokens := map[string]string{}
	var file strings.Builder
	file.WriteString("tokens:\n")
	for _, e := range []struct {
		name, role string
		agent      bool
	}{{"claude", "operator", true}, {"vera", "viewer", false}} {
		tok, sha, err := opsauth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[e.name] = tok
		fmt.Fprintf(&file, "  - name: %s\n    role: %s\n    agent: %v\n    sha256: %s\n", e.name, e.role, e.agent, sha)
	}
	tk, err := opsauth.ParseTokens([]byte(file.String()))
	if err != nil {
		t.Fatal(err)
	}
	policy, err := ops.ParsePolicy([]byte("rules:\n  - name: retry-one-order\n    action: dlq.retry\n    topic: order.events\n    max_rows: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := ops.New(drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := opsmcp.New(opsmcp.Config{Ops: o, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.HTTPHandler(tk, nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)

	// No token, a wrong token: 401 before any MCP handling.
	for _, auth := range []string{"", "Bearer ferry_not-a-token"} {
		req, _ := http.NewRequest(http.MethodPost, hs.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("POST with %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	connect := func(name string) *mcp.ClientSession {
		t.Helper()
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		cs, err := newClient().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer{tokens[name], tr}}}, nil)
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	agent, viewer := connect("claude"), connect("vera")
	tools := listTools(t, agent)

	who, _ := call[opsmcp.WhoamiOut](t, agent, tools, "whoami", map[string]any{})
	if who.Identity.Name != "claude" || !who.Identity.Agent || who.CanApprove || who.Identity.Source != "token" {
		t.Fatalf("agent identity %+v", who)
	}
	two := map[string]any{"action": "dlq.retry", "event_ids": []string{evs[0].ID.String(), evs[1].ID.String()}}
	plan, res := call[opsmcp.PreviewOut](t, viewer, tools, "preview_action", two)
	if res.IsError || plan.Rows != 2 || plan.AutoApprove != "" {
		t.Fatalf("viewer preview: %s %+v (2 rows exceed the policy's 1)", errText(res), plan)
	}
	_, res = call[opsmcp.ApprovalOut](t, viewer, tools, "request_action", map[string]any{"plan_hash": plan.PlanHash, "reason": "retry"})
	if !res.IsError || !strings.Contains(errText(res), "needs operator") {
		t.Fatalf("viewer request_action: %v %s, want refused (operator needed)", res.IsError, errText(res))
	}

	plan, _ = call[opsmcp.PreviewOut](t, agent, tools, "preview_action", two)
	req, res := call[opsmcp.ApprovalOut](t, agent, tools, "request_action", map[string]any{"plan_hash": plan.PlanHash, "reason": "the ORDERS stream exists now"})
	if res.IsError || req.Request.Status != ops.ApprovalPending || req.Request.RequestedBy != "claude" || !req.Request.RequestedAgent {
		t.Fatalf("agent request: %s %+v", errText(res), req)
	}
	if status(evs[0].ID.String()) != "dead" {
		t.Fatal("a request acted before approval")
	}
	// The agent's identity cannot approve, its own request included.
	if _, err := o.ApproveRequest(ctx, req.Request.ID, who.Identity, "approving my own"); !errors.Is(err, ops.ErrNotApprovable) {
		t.Fatalf("agent approval: %v, want ErrNotApprovable", err)
	}
	// A human approves with the CLI.
	approve := func(id int64) (string, error) {
		out, err := exec.Command(bin, "approvals", "approve", strconv.FormatInt(id, 10), "--reason", "checked the stream", "--actor", "alice",
			"--database-url", dbURL).CombinedOutput()
		return string(out), err
	}
	if out, err := approve(req.Request.ID); err != nil || !strings.Contains(out, "executed") {
		t.Fatalf("ferry approvals approve: %v\n%s", err, out)
	}
	waitFor(t, "both dead letters retried and published", func() bool {
		return status(evs[0].ID.String()) == "sent" && status(evs[1].ID.String()) == "sent"
	})
	ev, evRes := call[opsmcp.EvidenceOut](t, agent, tools, "evidence", map[string]any{"event_id": evs[0].ID.String()})
	if len(ev.Events) != 1 {
		t.Fatalf("evidence after approval: %d events: %s", len(ev.Events), errText(evRes))
	}
	if ev.Events[0].Published.Verdict != opsmcp.VerdictPublished {
		t.Fatalf("evidence after approval: %+v", ev.Events[0].Published)
	}
	appr, _ := call[opsmcp.ListApprovalsOut](t, agent, tools, "list_approvals", map[string]any{"status": "executed"})
	if len(appr.Requests) != 1 || appr.Requests[0].DecidedBy != "alice" {
		t.Fatalf("executed approvals %+v", appr)
	}

	// Rows change between the preview and the approval: refused, with the difference.
	one := map[string]any{"action": "dlq.retry", "event_ids": []string{evs[2].ID.String(), evs[3].ID.String()}}
	plan, _ = call[opsmcp.PreviewOut](t, agent, tools, "preview_action", one)
	req, res = call[opsmcp.ApprovalOut](t, agent, tools, "request_action", map[string]any{"plan_hash": plan.PlanHash, "reason": "retry the other two"})
	if res.IsError {
		t.Fatal(errText(res))
	}
	if _, err := drv.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'pending', attempts = 0 WHERE event_id = $1`, evs[2].ID.String()); err != nil {
		t.Fatal(err) // someone else retried it meanwhile
	}
	waitFor(t, "the other retry published", func() bool { return status(evs[2].ID.String()) == "sent" })
	out, err := approve(req.Request.ID)
	if err == nil || !strings.Contains(out, evs[2].ID.String()) || !strings.Contains(out, "no longer matches") {
		t.Fatalf("approval of a changed plan: %v\n%s — want refused naming %s", err, out, evs[2].ID)
	}
	if status(evs[3].ID.String()) != "dead" {
		t.Fatal("a refused approval retried a row")
	}
	// One row is within the policy: approved by it at once, still recorded as the agent's request.
	plan, _ = call[opsmcp.PreviewOut](t, agent, tools, "preview_action", map[string]any{"action": "dlq.retry", "event_ids": []string{evs[3].ID.String()}})
	if plan.Rows != 1 || plan.AutoApprove != "retry-one-order" {
		t.Fatalf("one-row preview %+v", plan)
	}
	req, res = call[opsmcp.ApprovalOut](t, agent, tools, "request_action", map[string]any{"plan_hash": plan.PlanHash, "reason": "last one"})
	if res.IsError || req.Request.Status != ops.ApprovalExecuted || req.Request.DecidedBy != "policy:retry-one-order" || req.Request.RequestedBy != "claude" {
		t.Fatalf("policy request: %s %+v", errText(res), req)
	}
	waitFor(t, "the policy-approved retry published", func() bool { return status(evs[3].ID.String()) == "sent" })
	var audited int
	if _, err := driver.QueryRow(ctx, drv.Executor(), `SELECT count(*) FROM ferry_ops_audit WHERE action LIKE 'approval.%'`, nil, &audited); err != nil || audited < 7 {
		t.Fatalf("approval audit rows: %d %v", audited, err)
	}
}

// TestMCPRefusesUnsafeListen: a non-loopback --listen without a tokens file
// does not start.
func TestMCPRefusesUnsafeListen(t *testing.T) {
	bin := ferryBinary(t)
	out, err := exec.Command(bin, "mcp", "--listen", "0.0.0.0:0", "--database-url", "sqlite:/nonexistent.db").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--tokens-file") {
		t.Fatalf("ferry mcp --listen 0.0.0.0:0: %v\n%s", err, out)
	}
}

// TestMCPCommandHTTP: `ferry mcp --listen … --tokens-file …` as a process:
// 401 without a token, tools listed with one.
func TestMCPCommandHTTP(t *testing.T) {
	bin := ferryBinary(t)
	ctx := context.Background()
	dir := t.TempDir()
	dbPath := dir + "/ferry.db"
	if out, err := exec.Command(bin, "migrate", "up", "--database-url", "sqlite:"+dbPath).CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	tok, sha, err := opsauth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tf := dir + "/tokens.yaml"
	if err := os.WriteFile(tf, []byte("tokens:\n  - name: claude\n    role: operator\n    agent: true\n    sha256: "+sha+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "mcp", "--listen", "127.0.0.1:0", "--tokens-file", tf, "--database-url", "sqlite:"+dbPath)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(stderr)
	var url string
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "ferry mcp on "); ok {
			url = rest
			break
		}
	}
	if url == "" {
		t.Fatal("ferry mcp did not say where it listens")
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	resp, err := http.Post(url, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cs, err := newClient().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{tok, tr}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	tools := listTools(t, cs)
	who, _ := call[opsmcp.WhoamiOut](t, cs, tools, "whoami", map[string]any{})
	if who.Identity.Name != "claude" || !who.Identity.Agent {
		t.Fatalf("identity %+v", who)
	}
}
