package console_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/console"
)

// validate checks v (decoded JSON) against an OpenAPI 3.0 schema: types,
// required properties, no undeclared property (the generated schemas say
// additionalProperties: false), nullable, $ref and allOf.
func validate(doc map[string]any, schema map[string]any, v any, path string) []string {
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		s, ok := doc["components"].(map[string]any)["schemas"].(map[string]any)[name].(map[string]any)
		if !ok {
			return []string{path + ": unresolved " + ref}
		}
		return validate(doc, s, v, path)
	}
	if v == nil {
		if schema["nullable"] == true {
			return nil
		}
		return []string{path + ": null where the schema does not allow it"}
	}
	if all, ok := schema["allOf"].([]any); ok {
		var errs []string
		for _, s := range all {
			errs = append(errs, validate(doc, s.(map[string]any), v, path)...)
		}
		return errs
	}
	typ, _ := schema["type"].(string)
	switch typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %T, want object", path, v)}
		}
		var errs []string
		props, _ := schema["properties"].(map[string]any)
		for _, r := range asList(schema["required"]) {
			if _, ok := m[r]; !ok {
				errs = append(errs, path+"."+r+": required, missing")
			}
		}
		for k, val := range m {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, validate(doc, ps, val, path+"."+k)...)
			} else if ap, ok := schema["additionalProperties"].(map[string]any); ok {
				errs = append(errs, validate(doc, ap, val, path+"."+k)...)
			} else if schema["additionalProperties"] == false {
				errs = append(errs, path+"."+k+": not in the schema")
			}
		}
		return errs
	case "array":
		a, ok := v.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %T, want array", path, v)}
		}
		var errs []string
		for i, x := range a {
			errs = append(errs, validate(doc, schema["items"].(map[string]any), x, fmt.Sprintf("%s[%d]", path, i))...)
		}
		return errs
	case "string":
		if _, ok := v.(string); !ok {
			return []string{fmt.Sprintf("%s: %T, want string", path, v)}
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) {
			return []string{fmt.Sprintf("%s: %v, want integer", path, v)}
		}
	case "number":
		if _, ok := v.(float64); !ok {
			return []string{fmt.Sprintf("%s: %T, want number", path, v)}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return []string{fmt.Sprintf("%s: %T, want boolean", path, v)}
		}
	}
	return nil
}

func asList(v any) []string {
	var out []string
	switch l := v.(type) {
	case []any:
		for _, x := range l {
			out = append(out, x.(string))
		}
	case []string:
		out = l
	}
	return out
}

// Every endpoint of the document is called with real data, and every
// response (200s and problem documents) is validated against the schema
// the document gives for it; an endpoint of the document not exercised
// here fails the test, as does a route the server has and the document
// lacks.
func TestOpenAPIMatchesResponses(t *testing.T) {
	both(t, console.Config{MaxBody: 4096}, func(t *testing.T, e *env) {
		_, b, _ := call(t, e, "GET", "/api/v1/openapi.json", "", nil)
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil || doc["openapi"] != "3.0.3" {
			t.Fatalf("document: %v %.200s", err, b)
		}
		evs := e.insert(t, event("o-1", "order.created"), event("o-1", "order.paid"), event("o-2", "order.created"), event("o-3", "order.created"))
		id0, id1, id2 := evs[0].ID.String(), evs[1].ID.String(), evs[2].ID.String()
		markDead(t, e, "broker rejected: <b>schema</b>", id1, id2)
		mustExec(t, e, `UPDATE ferry_outbox SET status = 'sent', published_at = created_at, broker_receipt = '{"seq":1}', attempts = 1 WHERE event_id = $1`, id0)
		mustExec(t, e, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
			VALUES ('billing', 'acme', $1, $2, 'order', 'o-1', 1, 'order.created', $3)`, id0, []byte{1, 2}, evs[0].OccurredAt)
		parkedID, effectID := seedDetailRows(t, e, evs[3])
		pid, fid := fmt.Sprint(parkedID), fmt.Sprint(effectID)

		paths := doc["paths"].(map[string]any)
		called := map[string]bool{}
		check := func(method, tmpl, path, token string, body any, wantCode int) {
			t.Helper()
			op, ok := paths[tmpl].(map[string]any)[strings.ToLower(method)].(map[string]any)
			if !ok {
				t.Fatalf("%s %s is not in the document", method, tmpl)
			}
			called[method+" "+tmpl] = true
			code, b, h := call(t, e, method, path, token, body)
			if code != wantCode {
				t.Fatalf("%s %s: %d, want %d: %s", method, path, code, wantCode, b)
			}
			resp, ok := op["responses"].(map[string]any)[fmt.Sprint(code)].(map[string]any)
			if !ok {
				t.Fatalf("%s %s: status %d not documented", method, tmpl, code)
			}
			var ct string
			var media map[string]any
			for k, v := range resp["content"].(map[string]any) {
				ct, media = k, v.(map[string]any)
			}
			if got := h.Get("Content-Type"); got != ct {
				t.Errorf("%s %s: Content-Type %q, documented %q", method, path, got, ct)
			}
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if errs := validate(doc, media["schema"].(map[string]any), v, "$"); len(errs) > 0 {
				sort.Strings(errs)
				t.Errorf("%s %s (%d) does not match the document:\n  %s", method, path, code, strings.Join(errs, "\n  "))
			}
		}
		op, view := operatorToken, viewerToken
		check("GET", "/api/v1/me", "/api/v1/me", view, nil, 200)
		check("GET", "/api/v1/status", "/api/v1/status", view, nil, 200)
		check("GET", "/api/v1/outbox", "/api/v1/outbox?limit=2", view, nil, 200)
		check("GET", "/api/v1/outbox", "/api/v1/outbox?status=lost", view, nil, 400)
		check("GET", "/api/v1/outbox/{event_id}", "/api/v1/outbox/"+id1, view, nil, 200)
		check("GET", "/api/v1/outbox/{event_id}", "/api/v1/outbox/0190a0b2-0000-7000-8000-000000000000", view, nil, 404)
		check("POST", "/api/v1/outbox/{event_id}/reveal", "/api/v1/outbox/"+id1+"/reveal", op, map[string]any{"reason": "support ticket 7"}, 200)
		check("POST", "/api/v1/outbox/{event_id}/reveal", "/api/v1/outbox/"+id1+"/reveal", view, map[string]any{"reason": "x"}, 403)
		check("POST", "/api/v1/outbox/replay", "/api/v1/outbox/replay", op, map[string]any{"filter": map[string]any{"event_ids": []string{id0}}}, 200)
		check("GET", "/api/v1/dead", "/api/v1/dead?limit=1", view, nil, 200)
		check("GET", "/api/v1/dead", "/api/v1/dead", "", nil, 401)
		check("POST", "/api/v1/dead/retry", "/api/v1/dead/retry", op, map[string]any{"filter": map[string]any{"event_ids": []string{id1}}}, 200)
		check("POST", "/api/v1/dead/retry", "/api/v1/dead/retry", op, map[string]any{"filter": map[string]any{"topic": strings.Repeat("x", 5000)}}, 413)
		check("POST", "/api/v1/dead/discard", "/api/v1/dead/discard", op, map[string]any{"filter": map[string]any{"event_ids": []string{id2}}, "approve": true, "reason": "obsolete order"}, 200)
		check("GET", "/api/v1/parked", "/api/v1/parked", view, nil, 200)
		check("GET", "/api/v1/parked/{id}", "/api/v1/parked/"+pid, view, nil, 200)
		check("GET", "/api/v1/parked/{id}", "/api/v1/parked/99999", view, nil, 404)
		check("POST", "/api/v1/parked/{id}/reveal", "/api/v1/parked/"+pid+"/reveal", op, map[string]any{"reason": "support ticket 8"}, 200)
		check("POST", "/api/v1/parked/{id}/reveal", "/api/v1/parked/"+pid+"/reveal", view, map[string]any{"reason": "x"}, 403)
		check("POST", "/api/v1/parked/{id}/reveal", "/api/v1/parked/"+pid+"/reveal", op, map[string]any{}, 400)
		check("GET", "/api/v1/effects/{id}", "/api/v1/effects/"+fid, view, nil, 200)
		check("GET", "/api/v1/effects/{id}", "/api/v1/effects/99999", view, nil, 404)
		check("GET", "/api/v1/effects/{id}", "/api/v1/effects/x1", view, nil, 400)
		check("POST", "/api/v1/effects/{id}/reveal", "/api/v1/effects/"+fid+"/reveal", op, map[string]any{"reason": "support ticket 9"}, 200)
		check("POST", "/api/v1/effects/{id}/reveal", "/api/v1/effects/"+fid+"/reveal", view, map[string]any{"reason": "x"}, 403)
		check("POST", "/api/v1/parked/replay", "/api/v1/parked/replay", op, map[string]any{"filter": map[string]any{"all": true}}, 200)
		check("POST", "/api/v1/parked/release-gap", "/api/v1/parked/release-gap", op, map[string]any{"filter": map[string]any{"all": true}}, 200)
		check("GET", "/api/v1/effects/failed", "/api/v1/effects/failed", view, nil, 200)
		check("POST", "/api/v1/effects/requeue", "/api/v1/effects/requeue", op, map[string]any{"filter": map[string]any{"all": true}}, 200)
		check("POST", "/api/v1/cleanup/preview", "/api/v1/cleanup/preview", view, map[string]any{"retention": "720h"}, 200)
		check("POST", "/api/v1/cleanup/preview", "/api/v1/cleanup/preview", view, map[string]any{"retention": "1s"}, 400)
		check("GET", "/api/v1/evidence", "/api/v1/evidence?q="+id0, view, nil, 200)
		check("GET", "/api/v1/evidence", "/api/v1/evidence?q=corr-o-1&kind=correlation_id", view, nil, 200)
		check("GET", "/api/v1/audit", "/api/v1/audit", view, nil, 200)
		for p, ops := range paths {
			for m := range ops.(map[string]any) {
				if !called[strings.ToUpper(m)+" "+p] {
					t.Errorf("%s %s is documented but not checked against a response", m, p)
				}
			}
		}
		// The document and the server's routes agree: a path of the
		// document answers something other than 404 "no such endpoint".
		re := regexp.MustCompile(`\{[a-z_]+\}`)
		for p := range paths {
			code, b, _ := call(t, e, "OPTIONS", re.ReplaceAllString(p, "x"), view, nil)
			if code == 404 && strings.Contains(string(b), "no such endpoint") {
				t.Errorf("%s: documented, not served", p)
			}
		}
	})
}

// The validator is not a yes-machine: a response missing a required
// property, carrying an undeclared one, or of another type fails.
func TestOpenAPIValidatorCatchesDrift(t *testing.T) {
	e := newEnv(t, "sqlite", console.Config{})
	_, b, _ := call(t, e, "GET", "/api/v1/openapi.json", "", nil)
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	me := map[string]any{"$ref": "#/components/schemas/Me"}
	_, b, _ = call(t, e, "GET", "/api/v1/me", viewerToken, nil)
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if errs := validate(doc, me, v, "$"); len(errs) != 0 {
		t.Fatalf("real response: %v", errs)
	}
	delete(v, "name")
	v["nickname"] = "vic"
	v["can_act"] = "yes"
	if errs := validate(doc, me, v, "$"); len(errs) != 3 {
		t.Fatalf("drifted response: %v", errs)
	}
}
