package deploy

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
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

// ParseRules parses a Prometheus rule file (gopkg.in/yaml.v3, unknown keys
// refused) and checks each rule has a name, an expression, a severity
// label and a summary annotation.
func ParseRules(src []byte) ([]Rule, error) {
	var doc struct {
		Groups []struct {
			Name     string `yaml:"name"`
			Interval string `yaml:"interval"`
			Rules    []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if len(doc.Groups) == 0 {
		return nil, fmt.Errorf("rules: no groups")
	}
	var out []Rule
	for gi, g := range doc.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			return nil, fmt.Errorf("rules: group %d needs a name and rules", gi)
		}
		for ri, r := range g.Rules {
			if r.Record != "" {
				return nil, fmt.Errorf("rules: %s rule %d is a recording rule; this file holds alerts only", g.Name, ri)
			}
			rule := Rule{Group: g.Name, Alert: r.Alert, Expr: strings.TrimSpace(r.Expr), For: r.For,
				Labels: r.Labels, Annotations: r.Annotations}
			if rule.Alert == "" || rule.Expr == "" {
				return nil, fmt.Errorf("rules: %s rule %d needs alert and expr", g.Name, ri)
			}
			if rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
				return nil, fmt.Errorf("rules: %s needs a severity label and a summary annotation", rule.Alert)
			}
			out = append(out, rule)
		}
	}
	return out, nil
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
