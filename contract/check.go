package contract

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Mode says which readers a change must not break.
type Mode string

const (
	// Backward: consumers on the new schema read events written under the
	// old one (upgrade consumers first). Breaks: narrowed type, new required
	// field without default, enum value removed.
	Backward Mode = "backward"
	// Forward: consumers on the old schema read events written under the
	// new one (upgrade producers first). Breaks: removed required field,
	// widened type, enum value added.
	Forward Mode = "forward"
	// Full: both.
	Full Mode = "full"
)

// ParseMode accepts backward, forward or full.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(s)); m {
	case Backward, Forward, Full:
		return m, nil
	}
	return "", fmt.Errorf("contract: mode %q: must be backward, forward or full", s)
}

// Change is one breaking change found by Check.
type Change struct {
	Key    Key    // the new contract (or the removed one)
	Than   int    // the version compared against (0: none)
	Path   string // JSON pointer into the schema, e.g. /properties/items/items
	Rule   string // removed-required, narrowed-type, widened-type, new-required, enum-removed, enum-added, version-reused, version-removed
	Detail string
	Breaks Mode // which direction it breaks
}

func (c Change) String() string {
	than := ""
	if c.Than > 0 && c.Than != c.Key.Version {
		than = fmt.Sprintf(" (against v%d)", c.Than)
	}
	p := c.Path
	if p == "" {
		p = "/"
	}
	return fmt.Sprintf("%s%s: %s at %s: %s [breaks %s]", c.Key, than, c.Rule, p, c.Detail, c.Breaks)
}

// Check compares old and new contract sets (local $refs are followed). A version in both with a
// different schema is "version-reused" and a version in old missing from
// new is "version-removed" (both break in every mode). A version only in
// new is compared with the highest lower version of its event type (in new,
// else in old) under mode.
func Check(old, new *Set, mode Mode) []Change {
	var out []Change
	for _, k := range old.Keys() {
		oc := old.byKey[k]
		nc, ok := new.byKey[k]
		if !ok {
			out = append(out, Change{Key: k, Than: k.Version, Rule: "version-removed", Detail: "the contract was deleted; events of this version may still be in outboxes, brokers and parked rows", Breaks: Full})
			continue
		}
		if !bytes.Equal(oc.Canon, nc.Canon) {
			out = append(out, Change{Key: k, Than: k.Version, Rule: "version-reused", Detail: "the schema of an existing version changed; publish the change as a new version", Breaks: Full})
		}
	}
	for _, k := range new.Keys() {
		if _, ok := old.byKey[k]; ok {
			continue
		}
		prev := predecessor(new, k)
		if prev == nil {
			prev = predecessor(old, k)
		}
		if prev == nil {
			continue // a new event type: nothing to break
		}
		d := differ{k: k, than: prev.Version, mode: mode, oroot: prev.Doc, nroot: new.byKey[k].Doc}
		out = append(out, d.diff(prev.Doc, new.byKey[k].Doc, "", 0)...)
	}
	return out
}

func predecessor(s *Set, k Key) *Contract {
	var best *Contract
	for kk, c := range s.byKey {
		if kk.EventType == k.EventType && kk.Version < k.Version && (best == nil || kk.Version > best.Version) {
			best = c
		}
	}
	return best
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func applies(breaks, mode Mode) bool { return mode == Full || breaks == mode }

// differ compares two schema documents; local $refs ("#/$defs/…") are
// followed in their own document.
type differ struct {
	k            Key
	than         int
	mode         Mode
	oroot, nroot any
}

// deref follows local $refs of node in root (bounded, for cycles).
func deref(root any, node map[string]any) map[string]any {
	for i := 0; i < 16 && node != nil; i++ {
		ref, ok := node["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#") {
			return node
		}
		var cur any = root
		for _, part := range strings.Split(strings.TrimPrefix(strings.TrimPrefix(ref, "#"), "/"), "/") {
			if part == "" {
				continue
			}
			part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
			cur = obj(cur)[part]
		}
		node = obj(cur)
	}
	return node
}

// diff compares two schema nodes.
func (d differ) diff(o, n any, path string, depth int) []Change {
	if depth > 32 {
		return nil
	}
	k, than, mode := d.k, d.than, d.mode
	om, nm := deref(d.oroot, obj(o)), deref(d.nroot, obj(n))
	if om == nil || nm == nil {
		return nil
	}
	var out []Change
	add := func(rule, detail string, breaks Mode) {
		if applies(breaks, mode) {
			out = append(out, Change{Key: k, Than: than, Path: path, Rule: rule, Detail: detail, Breaks: breaks})
		}
	}
	// type
	ot, nt := typeSet(om["type"]), typeSet(nm["type"])
	for t := range ot {
		if !nt.has(t) {
			add("narrowed-type", fmt.Sprintf("type %s no longer accepted (was %s, now %s)", t, ot, nt), Backward)
			break
		}
	}
	for t := range nt {
		if !ot.has(t) {
			add("widened-type", fmt.Sprintf("type %s newly accepted (was %s, now %s)", t, ot, nt), Forward)
			break
		}
	}
	// enum
	oe, ne := enumSet(om["enum"]), enumSet(nm["enum"])
	if oe != nil || ne != nil {
		for _, v := range sortedKeys(oe) {
			if ne != nil && !ne[v] {
				add("enum-removed", fmt.Sprintf("enum value %s removed", v), Backward)
			}
		}
		for _, v := range sortedKeys(ne) {
			if oe != nil && !oe[v] {
				add("enum-added", fmt.Sprintf("enum value %s added", v), Forward)
			}
		}
		if oe == nil && ne != nil {
			add("narrowed-type", "an enum now restricts the values", Backward)
		}
	}
	// required
	oreq, nreq := strSet(om["required"]), strSet(nm["required"])
	nprops := obj(nm["properties"])
	for _, f := range sortedKeys(oreq) {
		if !nreq[f] {
			add("removed-required", fmt.Sprintf("field %q was required and no longer is (or was removed)", f), Forward)
		}
	}
	for _, f := range sortedKeys(nreq) {
		if oreq[f] {
			continue
		}
		if p := obj(nprops[f]); p != nil {
			if _, hasDefault := p["default"]; hasDefault {
				continue
			}
		}
		add("new-required", fmt.Sprintf("field %q is newly required and has no default", f), Backward)
	}
	// properties, items: recurse
	oprops := obj(om["properties"])
	for _, name := range sortedKeys(keys(oprops)) {
		if np, ok := nprops[name]; ok {
			out = append(out, d.diff(oprops[name], np, path+"/properties/"+escape(name), depth+1)...)
		}
	}
	if oi, ok := om["items"]; ok {
		if ni, ok := nm["items"]; ok {
			out = append(out, d.diff(oi, ni, path+"/items", depth+1)...)
		}
	}
	return out
}

func escape(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }

type types map[string]bool

// typeSet of a "type" value; absent means any. "number" includes "integer".
func typeSet(v any) types {
	all := types{"null": true, "boolean": true, "object": true, "array": true, "number": true, "integer": true, "string": true}
	out := types{}
	switch t := v.(type) {
	case nil:
		return all
	case string:
		out[t] = true
	case []any:
		for _, e := range t {
			if s, ok := e.(string); ok {
				out[s] = true
			}
		}
	}
	if out["number"] {
		out["integer"] = true
	}
	return out
}

func (t types) has(s string) bool { return t[s] }

func (t types) String() string {
	if len(t) == 7 {
		return "any"
	}
	ks := sortedKeys(t)
	if t["number"] { // integer is implied
		var f []string
		for _, k := range ks {
			if k != "integer" {
				f = append(f, k)
			}
		}
		ks = f
	}
	return strings.Join(ks, "|")
}

func enumSet(v any) map[string]bool {
	a, ok := v.([]any)
	if !ok {
		return nil
	}
	out := map[string]bool{}
	for _, e := range a {
		out[fmt.Sprintf("%#v", canonValue(e))] = true
	}
	return out
}

func canonValue(v any) any {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

func strSet(v any) map[string]bool {
	out := map[string]bool{}
	if a, ok := v.([]any); ok {
		for _, e := range a {
			if s, ok := e.(string); ok {
				out[s] = true
			}
		}
	}
	return out
}

func keys(m map[string]any) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// SampleResult is the outcome of one golden sample.
type SampleResult struct {
	Key         Key
	File        string
	WantInvalid bool  // the file is named *.invalid.json
	Err         error // the validation error (nil: valid)
}

// OK reports whether the sample behaved as its name says.
func (r SampleResult) OK() bool { return (r.Err == nil) != r.WantInvalid }

// RunSamples validates dir/<event_type>/v<N>.samples/*.json against the
// contract of v<N>: a sample must validate, one named *.invalid.json must
// not. A samples directory without its schema is an error.
func RunSamples(dir string, s *Set) ([]SampleResult, error) {
	var out []SampleResult
	for _, k := range s.Keys() {
		sdir := filepath.Join(dir, k.EventType, fmt.Sprintf("v%d.samples", k.Version))
		files, err := os.ReadDir(sdir)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("contract: samples %s: %w", sdir, err)
		}
		for _, f := range files {
			if f.IsDir() || !strings.HasSuffix(f.Name(), ".json") {
				continue
			}
			p := filepath.Join(sdir, f.Name())
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, fmt.Errorf("contract: sample %s: %w", p, err)
			}
			out = append(out, SampleResult{Key: k, File: p, WantInvalid: strings.HasSuffix(f.Name(), ".invalid.json"), Err: s.byKey[k].Validate(b)})
		}
	}
	return out, nil
}
