package testenv

import (
	"encoding/json"
	"testing"
)

// WalkPlan decodes one statement's EXPLAIN (FORMAT JSON) output, calls
// visit on every plan node, depth first (init plans and CTEs included:
// they are child plans), and returns the root node.
func WalkPlan(t testing.TB, raw []byte, visit func(node map[string]any)) map[string]any {
	t.Helper()
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) != 1 {
		t.Fatalf("explain output: %v %s", err, raw)
	}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		visit(n)
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				if m, ok := k.(map[string]any); ok {
					walk(m)
				}
			}
		}
	}
	walk(doc[0].Plan)
	return doc[0].Plan
}
