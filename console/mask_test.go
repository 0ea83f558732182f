package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

const (
	canaryEmail = "CANARY-email-7f3a@x"
	canaryCard  = "CANARY-card-4111-9c21"
	canaryMemo  = "CANARY-memo-e5d0"
)

var canaries = []string{canaryEmail, canaryCard, canaryMemo}

var maskPayload = `{"customer":{"email":"` + canaryEmail + `","name":"visible-name"},"card":{"number":"` + canaryCard + `","brand":"visible-brand"},"total":4200}`

// newMaskEnv is a SQLite console whose Ops has the field mask yaml (none
// when empty), logging (ops and console) to log.
func newMaskEnv(t *testing.T, yaml string, log *testenv.Buffer) *env {
	t.Helper()
	ctx := context.Background()
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := []ops.Option{ops.WithLogger(logger)}
	if yaml != "" {
		p, err := ops.ParseMaskPolicy([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, ops.WithMask(p))
	}
	o, err := ops.New(drv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := console.New(o, console.Config{Auth: testTokens(t), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &env{name: "sqlite", db: drv, exec: drv.Executor(), ops: o, dialect: drv.Dialect(), srv: srv,
		insert: func(t testing.TB, evs ...ferry.Event) []ferry.Event {
			t.Helper()
			out, err := w.Insert(ctx, evs...)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}}
}

// TestConsoleMask: through the real reveal routes, a masked field's canary
// never reaches the response body (nor any read endpoint, nor the logs),
// the unmasked fields do, and the response names what was masked. A
// payload that is not JSON is withheld. The negative control, the same
// console without --mask, shows every canary.
func TestConsoleMask(t *testing.T) {
	const yaml = `order.created: ["$.customer.email", "$.card.number"]
"effect:psp/charge": ["$.memo"]
`
	for _, masked := range []bool{true, false} {
		t.Run(fmt.Sprintf("masked=%v", masked), func(t *testing.T) {
			var log testenv.Buffer
			policy := ""
			if masked {
				policy = yaml
			}
			e := newMaskEnv(t, policy, &log)
			ev := event("mask-1", "order.created")
			ev.Payload = []byte(maskPayload)
			id := e.insert(t, ev)[0].ID.String()
			binEv := event("mask-2", "order.created")
			binID := e.insert(t, binEv)[0].ID.String()
			mustExec(t, e, `UPDATE ferry_outbox SET payload = $1 WHERE event_id = $2`, []byte("\x01sealed\x00"+canaryEmail), binID)
			now := time.Now().UTC().Truncate(time.Second)
			mustExec(t, e, `INSERT INTO ferry_inbox_parked (consumer, reason, park_key, attempts, first_seen, last_seen, last_error, tenant_id, event_id,
    aggregate_type, aggregate_id, aggregate_seq, event_type, content_type, payload)
VALUES ('billing', 'poison', 'mask-1', 3, $1, $1, 'handler failed', 'acme', $2, 'order', 'mask-1', 1, 'order.created', 'application/json', $3)`,
				now, id, []byte(maskPayload))
			mustExec(t, e, `INSERT INTO ferry_effects (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha, state,
    attempts, next_attempt_at, created_at, updated_at)
VALUES ('mask-key-1', 'billing', $1, 'charge', 'acme', 'psp', 'charge', $2, $3, 'failed', 4, $4, $4, $4)`,
				id, []byte(`{"amount":100,"memo":"`+canaryMemo+`"}`), []byte{0}, now)
			pid := count(t, e, `SELECT id FROM ferry_inbox_parked WHERE park_key = 'mask-1'`)
			fid := count(t, e, `SELECT id FROM ferry_effects WHERE idem_key = 'mask-key-1'`)

			var bodies []byte
			for _, c := range []struct {
				path   string
				shown  []string
				masked []string
			}{
				{"/api/v1/outbox/" + id + "/reveal", []string{"visible-name", "visible-brand", "4200"}, []string{"$.customer.email", "$.card.number"}},
				{fmt.Sprintf("/api/v1/parked/%d/reveal", pid), []string{"visible-name", "visible-brand", "4200"}, []string{"$.customer.email", "$.card.number"}},
				{fmt.Sprintf("/api/v1/effects/%d/reveal", fid), []string{`"amount":100`}, []string{"$.memo"}},
			} {
				code, b, _ := call(t, e, "POST", c.path, operatorToken, map[string]any{"reason": "ticket 7"})
				var r console.RevealResponse
				if err := json.Unmarshal(b, &r); code != 200 || err != nil || r.AuditID == 0 {
					t.Fatalf("%s: %d %s %v", c.path, code, b, err)
				}
				bodies = append(bodies, b...)
				for _, s := range c.shown {
					if !strings.Contains(r.PayloadText, s) {
						t.Fatalf("%s: unmasked %q not shown: %s", c.path, s, b)
					}
				}
				if masked && (!reflect.DeepEqual(r.Masked, c.masked) || !strings.Contains(r.PayloadText, `"***"`)) {
					t.Fatalf("%s: masked %v, want %v: %s", c.path, r.Masked, c.masked, b)
				}
				if !masked && r.Masked != nil {
					t.Fatalf("%s: masked without a policy: %s", c.path, b)
				}
			}
			code, b, _ := call(t, e, "POST", "/api/v1/outbox/"+binID+"/reveal", operatorToken, map[string]any{"reason": "ticket 8"})
			var r console.RevealResponse
			if err := json.Unmarshal(b, &r); code != 200 || err != nil {
				t.Fatalf("binary reveal: %d %s", code, b)
			}
			bodies = append(bodies, b...)
			if masked && (!r.Withheld || r.PayloadBase64 != nil || r.PayloadText != "" || r.WithheldReason == "") {
				t.Fatalf("binary payload under a mask not withheld: %s", b)
			}
			// The read endpoints never carried payloads, masked or not.
			var reads []byte
			for _, p := range []string{"/api/v1/outbox/" + id, "/api/v1/outbox?event_id=" + id, "/api/v1/parked", fmt.Sprintf("/api/v1/parked/%d", pid),
				fmt.Sprintf("/api/v1/effects/%d", fid), "/api/v1/effects/failed", "/api/v1/evidence?q=" + id, "/api/v1/audit"} {
				code, b, _ := call(t, e, "GET", p, viewerToken, nil)
				if code != 200 {
					t.Fatalf("GET %s: %d %s", p, code, b)
				}
				reads = append(reads, b...)
			}
			if !bytes.Contains(reads, []byte(id)) || !bytes.Contains(reads, []byte("outbox.reveal_payload")) {
				t.Fatalf("the reads do not describe the rows: %s", reads)
			}
			logs := log.Bytes()
			if !bytes.Contains(logs, []byte("effects.reveal_request")) {
				t.Fatalf("the reveals logged nothing: the log check would be vacuous: %s", logs)
			}
			for _, c := range canaries {
				for what, b := range map[string][]byte{"read endpoints": reads, "logs": logs} {
					if bytes.Contains(b, []byte(c)) {
						t.Fatalf("%s show %q: %s", what, c, b)
					}
				}
				if masked == bytes.Contains(bodies, []byte(c)) {
					t.Fatalf("masked=%v: canary %q in reveal responses: %v (want %v)", masked, c, !masked, !masked)
				}
			}
		})
	}
}
