package console_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/opsauth"
)

// Who may do what: no or unknown token 401, viewer and agent 403 on
// actions, read-only 403 for everyone; viewers read.
func TestAPIAuthAndRoles(t *testing.T) {
	both(t, console.Config{}, func(t *testing.T, e *env) {
		evs := e.insert(t, event("o-1", "order.created"))
		markDead(t, e, "broker rejected: schema", evs[0].ID.String())
		retry := map[string]any{"filter": map[string]any{"event_ids": []string{evs[0].ID.String()}}}
		for _, c := range []struct {
			method, path, token string
			body                any
			want                int
		}{
			{"GET", "/api/v1/status", "", nil, 401},
			{"GET", "/api/v1/status", "not-a-token", nil, 401},
			{"GET", "/metrics", "", nil, 401},
			{"GET", "/api/v1/status", viewerToken, nil, 200},
			{"GET", "/api/v1/dead", viewerToken, nil, 200},
			{"POST", "/api/v1/dead/retry", viewerToken, retry, 403},
			{"POST", "/api/v1/outbox/" + evs[0].ID.String() + "/reveal", viewerToken, map[string]any{"reason": "x"}, 403},
			{"POST", "/api/v1/dead/retry", agentToken, retry, 403},
			{"POST", "/api/v1/dead/retry", operatorToken, retry, 200}, // a preview
			{"GET", "/api/v1/dead/retry", operatorToken, nil, 405},    // state changes are POST only
			{"GET", "/metrics", viewerToken, nil, 200},
			{"GET", "/healthz", "", nil, 200},
			{"GET", "/api/v1/openapi.json", "", nil, 200},
		} {
			code, b, h := call(t, e, c.method, c.path, c.token, c.body)
			if code != c.want {
				t.Errorf("%s %s as %q: %d, want %d: %s", c.method, c.path, c.token, code, c.want, b)
				continue
			}
			if code == 401 && (h.Get("Content-Type") != "application/problem+json" || h.Get("WWW-Authenticate") == "") {
				t.Errorf("401 headers %v", h)
			}
			if h.Get("Content-Security-Policy") == "" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
				t.Errorf("%s %s: security headers missing: %v", c.method, c.path, h)
			}
		}
		if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit`); n != 0 {
			t.Fatalf("refused requests wrote %d audit rows", n)
		}
	})
	// Read-only: even an operator's preview is refused.
	e := newEnv(t, "sqlite", console.Config{ReadOnly: true})
	code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, map[string]any{"filter": map[string]any{"all": true}})
	if code != 403 || !strings.Contains(string(b), "read-only") {
		t.Fatalf("read-only: %d %s", code, b)
	}
	var me console.Me
	_, b, _ = call(t, e, "GET", "/api/v1/me", operatorToken, nil)
	if err := json.Unmarshal(b, &me); err != nil || me.CanAct || !me.ReadOnly || me.Name != "olivia" {
		t.Fatalf("me in read-only: %s", b)
	}
}

// A cross-site POST is refused before it reaches the action, with or
// without a valid token; the same request from the console's own origin
// passes.
func TestCrossSitePOSTRejected(t *testing.T) {
	e := newEnv(t, "sqlite", console.Config{})
	evs := e.insert(t, event("o-1", "order.created"))
	markDead(t, e, "x", evs[0].ID.String())
	body := map[string]any{"filter": map[string]any{"all": true}, "approve": true, "reason": "forged"}
	for _, hdr := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
	} {
		code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, body, hdr...)
		if code != http.StatusForbidden || !strings.Contains(string(b), "cross-origin") {
			t.Errorf("%v: %d %s", hdr, code, b)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM ferry_outbox WHERE status = 'dead'`); n != 1 {
		t.Fatalf("forged requests changed rows: %d dead", n)
	}
	code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, body, "Sec-Fetch-Site", "same-origin", "Origin", e.srv.URL)
	if code != 200 {
		t.Fatalf("same-origin approve: %d %s", code, b)
	}
}

func TestOversizedBody413(t *testing.T) {
	e := newEnv(t, "sqlite", console.Config{MaxBody: 1024})
	big := `{"filter":{"topic":"` + strings.Repeat("x", 2000) + `"}}`
	code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, big)
	if code != http.StatusRequestEntityTooLarge || problem(t, b).Field != "body" {
		t.Fatalf("declared length: %d %s", code, b)
	}
	// Without a Content-Length (chunked), the reader's limit answers.
	req, _ := http.NewRequest("POST", e.srv.URL+"/api/v1/dead/retry", struct{ *strings.Reader }{strings.NewReader(big)})
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: %d", resp.StatusCode)
	}
}

// A preview changes nothing (every row of the touched tables compared);
// approving needs a reason (400 naming reason); the audit row's actor is
// the token's identity, and a client cannot name another actor.
func TestPreviewApproveAudit(t *testing.T) {
	both(t, console.Config{}, func(t *testing.T, e *env) {
		var ids []string
		for i := range 5 {
			ev := e.insert(t, event(fmt.Sprintf("o-%d", i), "order.created"))[0]
			ids = append(ids, ev.ID.String())
		}
		markDead(t, e, "broker rejected: schema", ids...)
		tables := []string{"ferry_outbox", "ferry_ops_audit"}
		before := snapshot(t, e, tables...)
		filter := map[string]any{"error_contains": "schema"}
		for _, path := range []string{"/api/v1/dead/retry", "/api/v1/dead/discard", "/api/v1/outbox/replay"} {
			code, b, _ := call(t, e, "POST", path, operatorToken, map[string]any{"filter": filter})
			if code != 200 {
				t.Fatalf("preview %s: %d %s", path, code, b)
			}
			var r struct {
				DryRun bool              `json:"dry_run"`
				Rows   int64             `json:"rows"`
				Sample []json.RawMessage `json:"sample"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			want := int64(5)
			if path == "/api/v1/outbox/replay" {
				want = 0 // nothing sent yet
			}
			if !r.DryRun || r.Rows != want || len(r.Sample) != int(want) {
				t.Fatalf("preview %s: %s", path, b)
			}
		}
		for _, path := range []string{"/api/v1/parked/replay", "/api/v1/effects/requeue"} {
			if code, b, _ := call(t, e, "POST", path, operatorToken, map[string]any{"filter": map[string]any{"all": true}}); code != 200 {
				t.Fatalf("preview %s: %d %s", path, code, b)
			}
		}
		if code, b, _ := call(t, e, "POST", "/api/v1/cleanup/preview", viewerToken, map[string]any{"retention": "720h"}); code != 200 {
			t.Fatalf("cleanup preview: %d %s", code, b)
		}
		if after := snapshot(t, e, tables...); after != before {
			t.Fatalf("previews changed rows:\nbefore %s\nafter %s", before, after)
		}
		// Approve without a reason: 400 naming reason, nothing changed.
		for _, reason := range []string{"", "   "} {
			code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, map[string]any{"filter": filter, "approve": true, "reason": reason})
			if p := problem(t, b); code != 400 || p.Field != "reason" {
				t.Fatalf("approve with reason %q: %d %s", reason, code, b)
			}
		}
		// A client-typed actor is not a field of the request.
		code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, map[string]any{"filter": filter, "approve": true, "reason": "r", "actor": "mallory"})
		if p := problem(t, b); code != 400 || p.Field != "actor" {
			t.Fatalf("actor field: %d %s", code, b)
		}
		if after := snapshot(t, e, tables...); after != before {
			t.Fatal("refused approvals changed rows")
		}
		code, b, _ = call(t, e, "POST", "/api/v1/dead/retry", operatorToken, map[string]any{"filter": filter, "approve": true, "reason": "schema fixed (INC-42)"})
		if code != 200 {
			t.Fatalf("approve: %d %s", code, b)
		}
		if n := count(t, e, `SELECT count(*) FROM ferry_outbox WHERE status = 'pending' AND attempts = 0`); n != 5 {
			t.Fatalf("retried rows: %d", n)
		}
		if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit WHERE actor = 'olivia' AND action = 'dlq.retry' AND reason = 'schema fixed (INC-42)' AND row_count = 5`); n != 1 {
			t.Fatalf("audit rows: %d", n)
		}
		// The audit page shows it.
		_, b, _ = call(t, e, "GET", "/api/v1/audit?actor=olivia", viewerToken, nil)
		if !strings.Contains(string(b), `"action":"dlq.retry"`) || !strings.Contains(string(b), `"total":1`) {
			t.Fatalf("audit page: %s", b)
		}
	})
}

// Bad input is a problem document naming the field.
func TestProblemsNameTheField(t *testing.T) {
	e := newEnv(t, "sqlite", console.Config{})
	for path, field := range map[string]string{
		"/api/v1/outbox?event_id=nope":             "event_id",
		"/api/v1/outbox?status=lost":               "status",
		"/api/v1/outbox?limit=abc":                 "limit",
		"/api/v1/outbox?since=yesterday":           "since",
		"/api/v1/outbox?colour=red":                "colour",
		"/api/v1/dead?older_than=soon":             "filter.older_than",
		"/api/v1/dead?after=zz":                    "filter.after",
		"/api/v1/parked?reason=bored":              "filter.reason",
		"/api/v1/evidence?q=":                      "query",
		"/api/v1/audit?limit=100000":               "limit",
		"/api/v1/outbox/not-a-uuid":                "event_id",
		"/api/v1/evidence?q=x&kind=telepathy":      "kind",
		"/api/v1/effects/failed?include_resolved=": "include_resolved",
	} {
		code, b, h := call(t, e, "GET", path, viewerToken, nil)
		if code != 400 || h.Get("Content-Type") != "application/problem+json" || problem(t, b).Field != field {
			t.Errorf("%s: %d %s (want field %s)", path, code, b, field)
		}
	}
	for body, field := range map[string]string{
		`{"filter":{"limit":"ten"}}`:                "filter.limit",
		`{"filter":{},"approve":true,"reason":"x"}`: "filter",
		`[1,2]`: "body",
	} {
		code, b, _ := call(t, e, "POST", "/api/v1/dead/retry", operatorToken, body)
		if code != 400 || problem(t, b).Field != field {
			t.Errorf("%s: %d %s (want field %s)", body, code, b, field)
		}
	}
}

func TestCheckListen(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true,
		"0.0.0.0:8080": false, ":8080": false, "10.1.2.3:80": false} {
		err := console.CheckListen(addr, false)
		if ok != (err == nil) {
			t.Errorf("%s without auth: %v", addr, err)
		}
		if err != nil && (!errors.Is(err, console.ErrUnsafeListen) || !strings.Contains(err.Error(), "--tokens-file")) {
			t.Errorf("%s: unclear error %v", addr, err)
		}
		if err := console.CheckListen(addr, true); err != nil {
			t.Errorf("%s with auth: %v", addr, err)
		}
	}
}

// Without authentication the console answers only to a loopback Host.
func TestLocalModeHostCheck(t *testing.T) {
	e := newEnv(t, "sqlite", console.Config{Auth: opsauth.LocalUser(false), LoopbackHostsOnly: true})
	code, _, _ := call(t, e, "GET", "/api/v1/status", "", nil)
	if code != 200 {
		t.Fatalf("loopback host: %d", code)
	}
	code, b, _ := call(t, e, "GET", "/api/v1/status", "", nil, "Host", "rebound.evil.example")
	if code != 403 {
		t.Fatalf("foreign Host: %d %s", code, b)
	}
}

// Request logs name the identity, never the token, and never a payload.
func TestNoTokenOrPayloadInLogs(t *testing.T) {
	var buf testenv.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, "sqlite", console.Config{Logger: logger})
	ev := event("o-1", "order.created")
	ev.Payload = []byte(`{"card":"4111-SECRET"}`)
	id := e.insert(t, ev)[0].ID.String()
	call(t, e, "GET", "/api/v1/status", operatorToken, nil)
	call(t, e, "GET", "/api/v1/status", "wrong-token-xyz", nil)
	if code, b, _ := call(t, e, "POST", "/api/v1/outbox/"+id+"/reveal", operatorToken, map[string]any{"reason": "ticket 1"}); code != 200 || !strings.Contains(string(b), "4111-SECRET") {
		t.Fatalf("reveal: %d %s", code, b)
	}
	logs := buf.String()
	if !strings.Contains(logs, "identity=olivia") {
		t.Fatalf("logs do not name the identity:\n%s", logs)
	}
	for _, secret := range []string{operatorToken, "wrong-token-xyz", "4111-SECRET"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q:\n%s", secret, logs)
		}
	}
}
