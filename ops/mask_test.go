package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// Canary values: a masked field holds one; the test fails if it shows up
// anywhere it must not.
const (
	canaryEmail = "CANARY-email-7f3a@x"
	canaryCard  = "CANARY-card-4111-9c21"
	canarySSN   = "CANARY-ssn-078-05-1120"
	canaryMemo  = "CANARY-memo-e5d0"
)

var canaries = []string{canaryEmail, canaryCard, canarySSN, canaryMemo}

// maskPayload is an order.created payload: masked fields hold canaries,
// the others ("visible") must still show.
var maskPayload = `{"customer":{"email":"` + canaryEmail + `","name":"visible-name"},"items":[{"sku":"visible-sku","card":"` + canaryCard + `"},{"sku":"visible-sku-2","card":"` + canaryCard + `"}],"ssn":"` + canarySSN + `","total":4200}`

const maskYAML = `order.created: ["$.customer.email", "$.items[*].card"]
"effect:psp/charge": ["memo"]
"*": ["$.ssn"]
`

func testMask(t testing.TB) *ops.MaskPolicy {
	t.Helper()
	p, err := ops.ParseMaskPolicy([]byte(maskYAML))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func noCanary(t testing.TB, what string, b []byte) {
	t.Helper()
	for _, c := range canaries {
		if bytes.Contains(b, []byte(c)) {
			t.Fatalf("%s shows masked value %q: %s", what, c, b)
		}
	}
}

// TestMaskPolicyApply: every path form masks what it names and nothing
// else, keeps the payload's shape, counts what it replaced, and a payload
// that is not JSON under a policy naming its type is withheld.
func TestMaskPolicyApply(t *testing.T) {
	p := testMask(t)
	r := p.Apply("order.created", "application/json", []byte(maskPayload))
	noCanary(t, "masked payload", r.Payload)
	var got map[string]any
	if err := json.Unmarshal(r.Payload, &got); err != nil {
		t.Fatalf("masked payload is not JSON: %v %s", err, r.Payload)
	}
	want := map[string]any{"customer": map[string]any{"email": "***", "name": "visible-name"},
		"items": []any{map[string]any{"sku": "visible-sku", "card": "***"}, map[string]any{"sku": "visible-sku-2", "card": "***"}},
		"ssn":   "***", "total": float64(4200)}
	if !reflect.DeepEqual(got, want) || r.Withheld || r.MaskedValues != 4 ||
		!reflect.DeepEqual(r.Masked, []string{"$.customer.email", "$.items[*].card", "$.ssn"}) {
		t.Fatalf("masked: %s %+v", r.Payload, r)
	}
	// "*" applies to a type the policy does not name; no path matches: shown.
	if r := p.Apply("order.shipped", "application/cloudevents+json; charset=utf-8", []byte(`{"ssn":{"a":1},"n":12345678901234567890}`)); string(r.Payload) != `{"n":12345678901234567890,"ssn":"***"}` || r.MaskedValues != 1 {
		t.Fatalf("default paths: %s %+v", r.Payload, r)
	}
	// Markup is not escaped (the console escapes it when it renders).
	if r := p.Apply("x", "", []byte(`{"note":"<b>&</b>"}`)); string(r.Payload) != `{"note":"<b>&</b>"}` || len(r.Masked) != 0 {
		t.Fatalf("no match: %s %+v", r.Payload, r)
	}
	// A duplicate member is masked in the output, never passed through.
	if r := p.Apply("x", "", []byte(`{"ssn":"a","ssn":"`+canarySSN+`"}`)); string(r.Payload) != `{"ssn":"***"}` {
		t.Fatalf("duplicate member: %s", r.Payload)
	}
	for _, c := range []struct{ paths, in, want string }{
		{`["$.a[0]"]`, `{"a":[1,2]}`, `{"a":["***",2]}`},
		{`["$.a[5]"]`, `{"a":[1,2]}`, `{"a":[1,2]}`},
		{`["$.m.*"]`, `{"m":{"x":1,"y":[2]},"k":3}`, `{"k":3,"m":{"x":"***","y":"***"}}`},
		{`["$[\"odd.key\"].x"]`, `{"odd.key":{"x":1},"odd":{"key":{"x":2}}}`, `{"odd":{"key":{"x":2}},"odd.key":{"x":"***"}}`},
		{`["a.b"]`, `{"a":{"b":{"deep":true}}}`, `{"a":{"b":"***"}}`},
		{`["$"]`, `{"a":1}`, `"***"`},
		{`["$.a[*]"]`, `{"a":{"x":1}}`, `{"a":{"x":1}}`}, // [*] on an object: no match
		{`["$.a.x"]`, `[{"a":{"x":1}}]`, `[{"a":{"x":1}}]`},
	} {
		p, err := ops.ParseMaskPolicy([]byte(`t: ` + c.paths))
		if err != nil {
			t.Fatalf("%s: %v", c.paths, err)
		}
		if r := p.Apply("t", "application/json", []byte(c.in)); string(r.Payload) != c.want {
			t.Fatalf("%s on %s: %s, want %s", c.paths, c.in, r.Payload, c.want)
		}
	}
	// Fail closed: not JSON, truncated JSON, ciphertext-like bytes.
	for _, in := range []string{"ssn=" + canarySSN, `{"ssn":"` + canarySSN, "\x00\x01" + canarySSN} {
		r := p.Apply("order.created", "application/json", []byte(in))
		if !r.Withheld || r.Payload != nil || !strings.Contains(r.WithheldReason, "not JSON") {
			t.Fatalf("non-JSON %q: %+v", in, r)
		}
	}
	// Fail closed on the content type too: a JSON-looking body of another
	// type (here a JSON string as text/plain) is withheld.
	for _, ct := range []string{"text/plain", "application/vnd.ferry.encrypted", "application/protobuf", "application/jsonx"} {
		r := p.Apply("order.created", ct, []byte(`"`+canarySSN+`"`))
		if !r.Withheld || r.Payload != nil || !strings.Contains(r.WithheldReason, ct) {
			t.Fatalf("content type %s: %+v", ct, r)
		}
	}
	// Negative control: no policy, or no paths for the type, shows it all.
	var none *ops.MaskPolicy
	if r := none.Apply("order.created", "text/plain", []byte(maskPayload)); string(r.Payload) != maskPayload {
		t.Fatalf("nil policy changed the payload: %s", r.Payload)
	}
	only, err := ops.ParseMaskPolicy([]byte(`order.created: [customer.email]`))
	if err != nil {
		t.Fatal(err)
	}
	if r := only.Apply("order.shipped", "text/plain", []byte("not json "+canarySSN)); r.Withheld || !bytes.Contains(r.Payload, []byte(canarySSN)) {
		t.Fatalf("type without paths: %+v", r)
	}
}

// TestMaskPolicyInvalid: a bad file or path is refused at load with an
// error naming the event type and the path.
func TestMaskPolicyInvalid(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{`order.created: ["$.a..b"]`, `"order.created": path "$.a..b"`},
		{`order.created: ["$.ok", "$.items[x]"]`, `"order.created": path "$.items[x]"`},
		{`"*": ["$a"]`, `"*": path "$a"`},
		{`o: ["$.a[*"]`, `path "$.a[*"`},
		{`o: ['$["k'] `, `unterminated`},
		{`o: ["$.a."]`, `path "$.a."`},
		{`o: [""]`, `empty path`},
		{`o: []`, `for "o": no paths`},
		{`- a`, `expected a map`},
		{`o: {a: 1}`, `expected a map`},
		{``, `empty file`},
	} {
		_, err := ops.ParseMaskPolicy([]byte(c.yaml))
		if !errors.Is(err, ops.ErrInvalidMask) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%q: %v, want ErrInvalidMask mentioning %s", c.yaml, err, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "mask.yaml")
	if err := os.WriteFile(path, []byte(`order.created: ["$.a[-1]"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.LoadMaskPolicy(path); !errors.Is(err, ops.ErrInvalidMask) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"$.a[-1]"`) {
		t.Fatalf("bad file: %v", err)
	}
	if _, err := ops.LoadMaskPolicy(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// logSink collects log output (one goroutine writes it).
type logSink struct{ bytes.Buffer }

// seedMaskRows inserts an order.created outbox event, a parked message of
// it and an effect intent whose request holds a canary memo; it returns
// the event id and the parked and effect row ids.
func seedMaskRows(t *testing.T, e *env) (string, int64, int64) {
	t.Helper()
	ev := event("mask-1", "order.created")
	ev.Payload = []byte(maskPayload)
	evs := e.insert(t, ev)
	id := evs[0].ID.String()
	now := time.Now().UTC().Truncate(time.Second)
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, attempts, first_seen, last_seen, last_error, tenant_id, event_id,
    aggregate_type, aggregate_id, aggregate_seq, event_type, content_type, payload)
VALUES ('billing', 'poison', 'mask-1', 3, $1, $1, 'handler failed', 'acme', $2, 'order', 'mask-1', 1, 'order.created', 'application/json', $3)`, tn("inbox_parked")),
		now, id, []byte(maskPayload))
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha, state,
    attempts, next_attempt_at, created_at, updated_at)
VALUES ('mask-key-1', 'billing', $1, 'charge', 'acme', 'psp', 'charge', $2, $3, 'failed', 4, $4, $4, $4)`, tn("effects")),
		id, []byte(`{"amount":100,"memo":"`+canaryMemo+`","ssn":"`+canarySSN+`"}`), []byte{0}, now)
	return id, count(t, e, fmt.Sprintf(`SELECT id FROM %s WHERE park_key = 'mask-1'`, tn("inbox_parked"))),
		count(t, e, fmt.Sprintf(`SELECT id FROM %s WHERE idem_key = 'mask-key-1'`, tn("effects")))
}

// TestRevealMasked: RevealPayload, RevealParkedPayload and
// RevealEffectRequest all go through the mask: no canary in the revealed
// payload, the audit table or the logs, the unmasked fields do show, and
// the result names what was masked. The negative control (no policy)
// shows every canary, so the check can fail.
func TestRevealMasked(t *testing.T) {
	for _, masked := range []bool{true, false} {
		t.Run(fmt.Sprintf("masked=%v", masked), func(t *testing.T) {
			var sink logSink
			opts := []ops.Option{ops.WithLogger(slog.New(slog.NewTextHandler(&sink, &slog.HandlerOptions{Level: slog.LevelDebug})))}
			if masked {
				opts = append(opts, ops.WithMask(testMask(t)))
			}
			both(t, func(t *testing.T, e *env) {
				ctx := context.Background()
				id, pid, fid := seedMaskRows(t, e)
				a := ops.Approval{Approve: true, Actor: "alice", Reason: "TICKET-1"}
				var all []byte
				for _, c := range []struct {
					name   string
					reveal func() (ops.RevealedPayload, error)
					shown  []string
					paths  []string
					values int
				}{
					{"outbox", func() (ops.RevealedPayload, error) { return e.ops.RevealPayload(ctx, id, a) },
						[]string{"visible-name", "visible-sku-2", "4200"}, []string{"$.customer.email", "$.items[*].card", "$.ssn"}, 4},
					{"parked", func() (ops.RevealedPayload, error) { return e.ops.RevealParkedPayload(ctx, pid, a) },
						[]string{"visible-name", "visible-sku-2", "4200"}, []string{"$.customer.email", "$.items[*].card", "$.ssn"}, 4},
					{"effect", func() (ops.RevealedPayload, error) { return e.ops.RevealEffectRequest(ctx, fid, a) },
						[]string{`"amount":100`}, []string{"memo", "$.ssn"}, 2},
				} {
					r, err := c.reveal()
					if err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					j, err := json.Marshal(r)
					if err != nil {
						t.Fatal(err)
					}
					all = append(append(all, r.Payload...), j...)
					for _, s := range c.shown {
						if !bytes.Contains(r.Payload, []byte(s)) {
							t.Fatalf("%s: unmasked %q missing: %s", c.name, s, r.Payload)
						}
					}
					if !masked {
						if r.Masked != nil || r.MaskedValues != 0 || r.Withheld {
							t.Fatalf("%s without a policy: %+v", c.name, r)
						}
						continue
					}
					noCanary(t, c.name+" reveal", r.Payload)
					noCanary(t, c.name+" reveal (JSON)", j)
					if !reflect.DeepEqual(r.Masked, c.paths) || r.MaskedValues != c.values || r.Withheld || r.AuditID == 0 {
						t.Fatalf("%s: masked %v (%d values), want %v (%d)", c.name, r.Masked, r.MaskedValues, c.paths, c.values)
					}
				}
				audit := snapshot(t, e, "ops_audit")
				if !strings.Contains(audit, "reveal") {
					t.Fatalf("no reveal audit rows: %s", audit)
				}
				noCanary(t, "ops_audit", []byte(audit))
				var counts []any
				for _, f := range revealFilters(t, e) {
					counts = append(counts, f["masked_values"])
				}
				want := []any{nil, nil, nil}
				if masked {
					want = []any{float64(2), float64(4), float64(4)} // newest first: effect, parked, outbox
				}
				if !reflect.DeepEqual(counts, want) {
					t.Fatalf("audit rows' masked_values %v, want %v", counts, want)
				}
				if !masked {
					for _, c := range canaries {
						if !bytes.Contains(all, []byte(c)) {
							t.Fatalf("negative control: %q not revealed without a policy", c)
						}
					}
				}
			}, opts...)
			if !bytes.Contains(sink.Bytes(), []byte("action=effects.reveal_request")) {
				t.Fatalf("the reveals logged nothing, the log check would be vacuous: %s", sink.Bytes())
			}
			noCanary(t, "ops log", sink.Bytes())
		})
	}
}

// TestRevealWithheld: a payload that is not JSON, under a policy that
// names fields for its type, is withheld by every reveal (fail closed),
// still audited; without the policy it shows.
func TestRevealWithheld(t *testing.T) {
	for _, masked := range []bool{true, false} {
		t.Run(fmt.Sprintf("masked=%v", masked), func(t *testing.T) {
			var opts []ops.Option
			if masked {
				opts = append(opts, ops.WithMask(testMask(t)))
			}
			e := newSQLite(t, opts...)
			ctx := context.Background()
			id, pid, fid := seedMaskRows(t, e)
			sealed := []byte("\x01ferry-sealed\x00" + canaryEmail)
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET payload = $1 WHERE event_id = $2`, tn("outbox")), sealed, id)
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET payload = $1 WHERE id = $2`, tn("inbox_parked")), sealed, pid)
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET request = $1 WHERE id = $2`, tn("effects")), []byte("memo="+canaryMemo), fid)
			a := ops.Approval{Approve: true, Actor: "alice", Reason: "TICKET-2"}
			for name, reveal := range map[string]func() (ops.RevealedPayload, error){
				"outbox": func() (ops.RevealedPayload, error) { return e.ops.RevealPayload(ctx, id, a) },
				"parked": func() (ops.RevealedPayload, error) { return e.ops.RevealParkedPayload(ctx, pid, a) },
				"effect": func() (ops.RevealedPayload, error) { return e.ops.RevealEffectRequest(ctx, fid, a) },
			} {
				r, err := reveal()
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !masked {
					if r.Withheld || !bytes.Contains(r.Payload, []byte("CANARY-")) {
						t.Fatalf("%s negative control: %+v", name, r)
					}
					continue
				}
				j, _ := json.Marshal(r)
				noCanary(t, name, j)
				if !r.Withheld || r.Payload != nil || r.WithheldReason == "" || r.AuditID == 0 {
					t.Fatalf("%s: not withheld: %+v", name, r)
				}

			}
			for i, f := range revealFilters(t, e) {
				if masked != (f["withheld"] == true) {
					t.Fatalf("masked=%v: audit row %d filter %v", masked, i, f)
				}
			}
		})
	}
}

// revealFilters decodes the filters of the reveal audit rows, newest first.
func revealFilters(t *testing.T, e *env) []map[string]any {
	t.Helper()
	rows, err := e.ops.Audit(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range rows {
		if !strings.Contains(r.Action, "reveal") {
			continue
		}
		var f map[string]any
		if err := json.Unmarshal([]byte(r.Filter), &f); err != nil {
			t.Fatalf("audit filter %q: %v", r.Filter, err)
		}
		out = append(out, f)
	}
	if len(out) != 3 {
		t.Fatalf("%d reveal audit rows, want 3", len(out))
	}
	return out
}

// TestMaskSizesOnly: the read paths that show rows without payloads
// (outbox search, evidence, parked and effect detail) carry no canary:
// they never read the payload, so there is nothing to mask.
func TestMaskSizesOnly(t *testing.T) {
	e := newSQLite(t)
	ctx := context.Background()
	id, pid, fid := seedMaskRows(t, e)
	var out []any
	ev, err := e.ops.Evidence(ctx, id, ops.KindAuto)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := e.ops.SearchOutbox(ctx, ops.OutboxQuery{EventID: id})
	if err != nil {
		t.Fatal(err)
	}
	pm, err := e.ops.Parked(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	fx, err := e.ops.Effect(ctx, fid)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, ev, sp, pm, fx)
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte(id)) < 4 || !bytes.Contains(b, []byte(`"request_bytes"`)) {
		t.Fatalf("the reads do not describe the rows: %s", b)
	}
	noCanary(t, "evidence, search and detail", b)
}
