package contract

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeSet writes files (path relative to a new dir → content) and loads them.
func writeSet(t *testing.T, files map[string]string) (string, *Set) {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return dir, s
}

const orderV1 = `{"type":"object","required":["id","items"],"properties":{
  "id":{"type":"string"},
  "status":{"enum":["new","paid"]},
  "total":{"type":"number"},
  "items":{"type":"array","items":{"type":"object","required":["sku"],"properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1}}}}}}`

func TestValidateNamesPathAndRule(t *testing.T) {
	_, s := writeSet(t, map[string]string{"order.created/v1.json": orderV1})
	cases := []struct {
		name, payload, path, rule, prop string
	}{
		{"minimum in an array element", `{"id":"a","items":[{"sku":"x","qty":0}]}`, "/items/0/qty", "minimum", ""},
		{"missing required", `{"items":[]}`, "", "required", "id"},
		{"wrong type", `{"id":7,"items":[]}`, "/id", "type", ""},
		{"enum", `{"id":"a","items":[],"status":"lost"}`, "/status", "enum", ""},
		{"not json", `{"id":`, "", "json", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.Validate("order.created", 1, []byte(c.payload))
			var v *Violation
			if !errors.As(err, &v) || !errors.Is(err, ErrViolation) {
				t.Fatalf("err = %v, want a *Violation", err)
			}
			if v.Path != c.path || v.Rule != c.rule || v.Property != c.prop {
				t.Errorf("got path %q rule %q property %q, want %q %q %q (%v)", v.Path, v.Rule, v.Property, c.path, c.rule, c.prop, err)
			}
			if strings.Contains(err.Error(), "lost") {
				t.Errorf("message carries a payload value: %v", err)
			}
		})
	}
	if err := s.Validate("order.created", 1, []byte(`{"id":"a","items":[{"sku":"x","qty":2}]}`)); err != nil {
		t.Errorf("valid payload: %v", err)
	}
	if err := s.Validate("order.created", 2, []byte(`{}`)); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("v2: err = %v, want ErrUnknownVersion", err)
	}
	if err := s.Validate("user.signed_up", 1, []byte(`not json`)); err != nil {
		t.Errorf("an event type without contracts is not governed: %v", err)
	}
}

func TestLoadRefusesStrayFiles(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"version zero":      {"a/v0.json": `{}`},
		"not versioned":     {"a/schema.json": `{}`},
		"file at top level": {"a.json": `{}`},
		"bad schema":        {"a/v1.json": `{"type":12}`},
		"orphan samples":    {"a/v2.samples/x.json": `{}`, "a/v1.json": `{}`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for p, c := range files {
				_ = os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
				_ = os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644)
			}
			if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "contract: ") {
				t.Fatalf("Load = %v, want an error naming the file", err)
			}
		})
	}
}

// TestCheckRules is the table of schema pairs: each breaking rule under the
// mode it breaks, and each safe change.
func TestCheckRules(t *testing.T) {
	base := `{"type":"object","required":["id"],"properties":{"id":{"type":"string"},"n":{"type":"number"},"s":{"enum":["a","b"]},"tags":{"type":"array","items":{"type":"string"}}}}`
	cases := []struct {
		name  string
		v2    string
		mode  Mode
		rules []string // want these rules, in order; empty = safe
	}{
		{"removed required field", `{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"number"},"s":{"enum":["a","b"]},"tags":{"type":"array","items":{"type":"string"}}}}`, Forward, []string{"removed-required"}},
		{"removed required field, full", `{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"number"},"s":{"enum":["a","b"]},"tags":{"type":"array","items":{"type":"string"}}}}`, Full, []string{"removed-required"}},
		{"narrowed type number to integer", strings.Replace(base, `"n":{"type":"number"}`, `"n":{"type":"integer"}`, 1), Backward, []string{"narrowed-type"}},
		{"narrowed type in array items", strings.Replace(base, `"items":{"type":"string"}`, `"items":{"type":"null"}`, 1), Backward, []string{"narrowed-type"}},
		{"new required without default", strings.Replace(base, `"required":["id"]`, `"required":["id","n"]`, 1), Backward, []string{"new-required"}},
		{"enum value removed", strings.Replace(base, `["a","b"]`, `["a"]`, 1), Backward, []string{"enum-removed"}},
		{"enum value added breaks forward", strings.Replace(base, `["a","b"]`, `["a","b","c"]`, 1), Forward, []string{"enum-added"}},
		{"widened type breaks forward", strings.Replace(base, `"n":{"type":"number"}`, `"n":{"type":["number","string"]}`, 1), Forward, []string{"widened-type"}},

		{"safe: optional field added", strings.Replace(base, `"id":{"type":"string"},`, `"id":{"type":"string"},"note":{"type":"string"},`, 1), Full, nil},
		{"safe: new required with default", strings.Replace(strings.Replace(base, `"required":["id"]`, `"required":["id","n"]`, 1), `"n":{"type":"number"}`, `"n":{"type":"number","default":0}`, 1), Backward, nil},
		{"safe backward: enum value added", strings.Replace(base, `["a","b"]`, `["a","b","c"]`, 1), Backward, nil},
		{"safe backward: widened type", strings.Replace(base, `"n":{"type":"number"}`, `"n":{"type":["number","string"]}`, 1), Backward, nil},
		{"safe forward: required field removed is backward-safe", `{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"number"},"s":{"enum":["a","b"]},"tags":{"type":"array","items":{"type":"string"}}}}`, Backward, nil},
		{"safe forward: enum value removed", strings.Replace(base, `["a","b"]`, `["a"]`, 1), Forward, nil},
		{"safe: identical", base, Full, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, old := writeSet(t, map[string]string{"e/v1.json": base})
			_, nw := writeSet(t, map[string]string{"e/v1.json": base, "e/v2.json": c.v2})
			got := Check(old, nw, c.mode)
			var rules []string
			for _, ch := range got {
				rules = append(rules, ch.Rule)
				if ch.Key != (Key{"e", 2}) || ch.Than != 1 {
					t.Errorf("change %v: want it on e v2 against v1", ch)
				}
			}
			if strings.Join(rules, ",") != strings.Join(c.rules, ",") {
				t.Errorf("rules = %v, want %v (%v)", rules, c.rules, got)
			}
		})
	}
}

// Local $refs are followed: a narrowed type behind "#/$defs/…" is found.
func TestCheckFollowsLocalRefs(t *testing.T) {
	v1 := `{"$defs":{"money":{"type":"number"}},"type":"object","properties":{"total":{"$ref":"#/$defs/money"}}}`
	v2 := `{"$defs":{"money":{"type":"integer"}},"type":"object","properties":{"total":{"$ref":"#/$defs/money"}}}`
	_, old := writeSet(t, map[string]string{"e/v1.json": v1})
	_, nw := writeSet(t, map[string]string{"e/v1.json": v1, "e/v2.json": v2})
	got := Check(old, nw, Backward)
	if len(got) != 1 || got[0].Rule != "narrowed-type" || got[0].Path != "/properties/total" {
		t.Fatalf("changes = %v, want narrowed-type at /properties/total", got)
	}
}

func TestCheckVersionReusedAndRemoved(t *testing.T) {
	_, old := writeSet(t, map[string]string{"e/v1.json": `{"type":"object"}`, "f/v1.json": `{}`})
	_, nw := writeSet(t, map[string]string{"e/v1.json": `{"type":"object","required":["x"]}`})
	got := Check(old, nw, Backward)
	if len(got) != 2 || got[0].Rule != "version-reused" || got[1].Rule != "version-removed" || got[1].Key != (Key{"f", 1}) {
		t.Fatalf("changes = %v, want version-reused on e v1 and version-removed on f v1", got)
	}
	// Same schema, reformatted: not a change.
	_, same := writeSet(t, map[string]string{"e/v1.json": "{\n  \"type\": \"object\"\n}", "f/v1.json": `{ }`})
	if got := Check(old, same, Full); len(got) != 0 {
		t.Errorf("reformatted schema reported: %v", got)
	}
}

func TestSamples(t *testing.T) {
	dir, s := writeSet(t, map[string]string{
		"order.created/v1.json":                          orderV1,
		"order.created/v1.samples/ok.json":               `{"id":"a","items":[]}`,
		"order.created/v1.samples/zero-qty.invalid.json": `{"id":"a","items":[{"sku":"x","qty":0}]}`,
		"order.created/v1.samples/broken.json":           `{"items":[]}`,
	})
	res, err := RunSamples(dir, s)
	if err != nil {
		t.Fatal(err)
	}
	ok := map[string]bool{}
	for _, r := range res {
		ok[filepath.Base(r.File)] = r.OK()
	}
	want := map[string]bool{"ok.json": true, "zero-qty.invalid.json": true, "broken.json": false}
	if len(ok) != len(want) {
		t.Fatalf("results %v, want %v", ok, want)
	}
	for f, w := range want {
		if ok[f] != w {
			t.Errorf("%s: OK = %v, want %v", f, ok[f], w)
		}
	}
}
