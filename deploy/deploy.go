package deploy

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
)

// AlertRulesYAML is deploy/prometheus/ferry-alerts.yml.
//
//go:embed prometheus/ferry-alerts.yml
var AlertRulesYAML []byte

// DashboardJSON is deploy/grafana/ferry-dashboard.json.
//
//go:embed grafana/ferry-dashboard.json
var DashboardJSON []byte

// Rule is one alerting rule.
type Rule struct {
	Group       string
	Alert       string
	Expr        string
	For         string
	Labels      map[string]string
	Annotations map[string]string
}

// AlertRules parses AlertRulesYAML.
func AlertRules() ([]Rule, error) { return ParseRules(AlertRulesYAML) }

// ParseRules parses a Prometheus rule file (in the block-YAML subset this
// package reads) and checks each rule has a name, an expression and a
// severity label.
func ParseRules(src []byte) ([]Rule, error) {
	doc, err := parseYAML(string(src))
	if err != nil {
		return nil, err
	}
	root, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("rules: top level is not a map")
	}
	groups, ok := root["groups"].([]any)
	if !ok || len(groups) == 0 {
		return nil, fmt.Errorf("rules: no groups")
	}
	var out []Rule
	for gi, g := range groups {
		gm, ok := g.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("rules: group %d is not a map", gi)
		}
		name, _ := gm["name"].(string)
		rules, ok := gm["rules"].([]any)
		if name == "" || !ok {
			return nil, fmt.Errorf("rules: group %d needs a name and rules", gi)
		}
		for ri, r := range rules {
			rm, ok := r.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("rules: %s rule %d is not a map", name, ri)
			}
			rule := Rule{Group: name, Labels: strMap(rm["labels"]), Annotations: strMap(rm["annotations"])}
			rule.Alert, _ = rm["alert"].(string)
			rule.Expr, _ = rm["expr"].(string)
			rule.For, _ = rm["for"].(string)
			if rule.Alert == "" || rule.Expr == "" {
				return nil, fmt.Errorf("rules: %s rule %d needs alert and expr", name, ri)
			}
			if rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
				return nil, fmt.Errorf("rules: %s needs a severity label and a summary annotation", rule.Alert)
			}
			out = append(out, rule)
		}
	}
	return out, nil
}

func strMap(v any) map[string]string {
	out := map[string]string{}
	if m, ok := v.(map[string]any); ok {
		for k, x := range m {
			if s, ok := x.(string); ok {
				out[k] = s
			}
		}
	}
	return out
}

// Panel is one dashboard panel's title and query expressions.
type Panel struct {
	Title string
	Exprs []string
}

// DashboardPanels parses DashboardJSON and returns each panel with targets.
func DashboardPanels() ([]Panel, error) { return ParseDashboard(DashboardJSON) }

// ParseDashboard reads a Grafana dashboard and returns its panels' queries
// (rows' nested panels included).
func ParseDashboard(src []byte) ([]Panel, error) {
	var d struct {
		Title  string            `json:"title"`
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(src, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	if d.Title == "" || d.UID == "" {
		return nil, fmt.Errorf("dashboard: needs a title and a uid")
	}
	var out []Panel
	var walk func(raw []json.RawMessage) error
	walk = func(raw []json.RawMessage) error {
		for _, r := range raw {
			var p struct {
				Title   string            `json:"title"`
				Type    string            `json:"type"`
				Panels  []json.RawMessage `json:"panels"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(r, &p); err != nil {
				return fmt.Errorf("dashboard panel: %w", err)
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
			if p.Type == "row" {
				continue
			}
			panel := Panel{Title: p.Title}
			for _, t := range p.Targets {
				if t.Expr != "" {
					panel.Exprs = append(panel.Exprs, t.Expr)
				}
			}
			if len(panel.Exprs) == 0 {
				return fmt.Errorf("dashboard panel %q has no query", p.Title)
			}
			out = append(out, panel)
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	return out, nil
}

var metricRE = regexp.MustCompile(`\bferry_[a-zA-Z0-9_]+`)

// ReferencedMetrics returns the ferry_* series names an expression reads,
// sorted and de-duplicated. Histogram series (_bucket, _sum, _count) are
// returned as written; callers map them to the histogram's name.
func ReferencedMetrics(expr string) []string {
	seen := map[string]bool{}
	for _, m := range metricRE.FindAllString(expr, -1) {
		seen[m] = true
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
