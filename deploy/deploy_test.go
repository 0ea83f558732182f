package deploy

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/relay/cdc"
)

// recorder is a Registerer that keeps what packages register, so their
// descriptors (vectors included, which Gather omits until first use) can
// be read without running anything.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.cs = append(r.cs, cs...)
}
func (r *recorder) Unregister(prometheus.Collector) bool { return true }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) names(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqNameRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			out[m[1]] = true
		}
	}
	return out
}

// exportedMetrics builds every Ferry package's metric set on a recorder.
// Nothing runs: constructors only register their collectors.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{}
	rec.MustRegister(ops.NewCollector(nil))

	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	db := sqlite.New(nil)
	if _, err := relay.New(db, pub, relay.WithRegisterer(rec)); err != nil {
		t.Fatalf("relay metrics: %v", err)
	}
	if _, err := cdc.New("postgres://localhost/db", pub, cdc.WithRegisterer(rec)); err != nil {
		t.Fatalf("cdc metrics: %v", err)
	}
	if _, err := inbox.New(db, "deploy-test", func(context.Context, *sql.Tx, ferry.Event) error { return nil },
		inbox.WithRegisterer(rec)); err != nil {
		t.Fatalf("inbox metrics: %v", err)
	}
	ledger, err := effect.NewLedger(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := effect.NewWorker(ledger,
		effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) { return effect.Result{}, nil }),
		effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) { return effect.Status{}, nil }),
		effect.WithRegisterer(rec)); err != nil {
		t.Fatalf("effect metrics: %v", err)
	}
	names := rec.names(t)
	for _, n := range ops.MetricNames() {
		if !names[n] {
			t.Errorf("ops.MetricNames lists %s but the Collector does not describe it", n)
		}
	}
	return names
}

// unknown returns the ferry_* names expr reads that are not exported. A
// histogram's _bucket/_sum/_count series count as its name.
func unknown(expr string, exported map[string]bool) []string {
	var out []string
	for _, m := range ReferencedMetrics(expr) {
		if exported[m] {
			continue
		}
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if base != m && exported[base] {
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestAlertsAndDashboardReferenceOnlyExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	rules, err := AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 10 {
		t.Fatalf("parsed %d rules, want at least 10", len(rules))
	}
	panels, err := DashboardPanels()
	if err != nil {
		t.Fatal(err)
	}
	if len(panels) < 10 {
		t.Fatalf("parsed %d panels, want at least 10", len(panels))
	}
	for _, r := range rules {
		if bad := unknown(r.Expr, exported); len(bad) > 0 {
			t.Errorf("alert %s reads %v, which no Ferry package exports", r.Alert, bad)
		}
		if len(ReferencedMetrics(r.Expr)) == 0 {
			t.Errorf("alert %s reads no ferry metric", r.Alert)
		}
	}
	for _, p := range panels {
		for _, e := range p.Exprs {
			if bad := unknown(e, exported); len(bad) > 0 {
				t.Errorf("panel %q reads %v, which no Ferry package exports", p.Title, bad)
			}
		}
	}
	// The checker itself can fail: a misspelt metric is caught.
	if bad := unknown("max(ferry_ops_outbox_oldest_pending_age_second) > 60", exported); len(bad) != 1 {
		t.Fatalf("checker missed a misspelt metric: %v", bad)
	}
	if bad := unknown("histogram_quantile(0.9, rate(ferry_relay_publish_latency_seconds_bucket[5m]))", exported); len(bad) != 0 {
		t.Fatalf("checker rejected a histogram bucket series: %v", bad)
	}
}

func TestRequiredAlertsExist(t *testing.T) {
	rules, err := AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	byMetric := map[string][]string{}
	for _, r := range rules {
		for _, m := range ReferencedMetrics(r.Expr) {
			byMetric[m] = append(byMetric[m], r.Alert)
		}
	}
	for _, m := range []string{
		ops.MetricTopicOldestPending, // oldest pending age > 60 s
		ops.MetricTopicDead,          // dead letters > 0
		ops.MetricParkedOldest,       // parked oldest age
		ops.MetricOldestGap,          // gap open > threshold
		ops.MetricEffectsOldestUnknown,
		ops.MetricRelayOwnedShards, // relay has no shards
		ops.MetricCDCSlotLag,       // slot lag
		ops.MetricSoftCap,          // outbox size cap
	} {
		if len(byMetric[m]) == 0 {
			t.Errorf("no alert reads %s", m)
		}
	}
	backlog := find(t, rules, "FerryOutboxBacklogStale")
	if !strings.Contains(backlog.Expr, "> 60") {
		t.Errorf("backlog alert threshold is not 60 s: %s", backlog.Expr)
	}
}

func find(t *testing.T, rules []Rule, name string) Rule {
	t.Helper()
	for _, r := range rules {
		if r.Alert == name {
			return r
		}
	}
	t.Fatalf("no alert %s", name)
	return Rule{}
}

func gauge(name string, v float64, labels ...string) *dto.MetricFamily {
	m := &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(v)}}
	for i := 0; i+1 < len(labels); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(labels[i]), Value: proto.String(labels[i+1])})
	}
	return &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_GAUGE.Enum(), Metric: []*dto.Metric{m}}
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := Promtool()
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	return p
}

// TestAlertRuleUnitTests runs Prometheus's own rule checker and the rule
// unit tests in prometheus/ferry-alerts_test.yml: each alert fires from
// synthetic series once its "for" has passed, and resolves.
func TestAlertRuleUnitTests(t *testing.T) {
	tool := promtool(t)
	dir := t.TempDir()
	copyFile(t, "prometheus/ferry-alerts.yml", filepath.Join(dir, "ferry-alerts.yml"))
	copyFile(t, "prometheus/ferry-alerts_test.yml", filepath.Join(dir, "ferry-alerts_test.yml"))
	ctx := context.Background()
	if err := runPromtool(ctx, tool, dir, "check", "rules", "ferry-alerts.yml"); err != nil {
		t.Fatal(err)
	}
	if err := runPromtool(ctx, tool, dir, "test", "rules", "ferry-alerts_test.yml"); err != nil {
		t.Fatal(err)
	}

	// The unit tests can fail: a rule whose threshold drifted is caught.
	src, err := os.ReadFile("prometheus/ferry-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(src), "(ferry_ops_outbox_oldest_pending_age_seconds) > 60", "(ferry_ops_outbox_oldest_pending_age_seconds) > 100", 1)
	if broken == string(src) {
		t.Fatal("backlog threshold not found in the rule file")
	}
	if err := os.WriteFile(filepath.Join(dir, "ferry-alerts.yml"), []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	err = runPromtool(ctx, tool, dir, "test", "rules", "ferry-alerts_test.yml")
	if err == nil || !strings.Contains(err.Error(), "FerryOutboxBacklogStale") {
		t.Fatalf("promtool passed a backlog rule with a drifted threshold: %v", err)
	}
}

// TestEveryAlertHasUnitTest: each alert in the rule file is tested firing
// and, later, resolved; a new alert without a test fails here.
func TestEveryAlertHasUnitTest(t *testing.T) {
	rules, err := AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("prometheus/ferry-alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				EvalTime  string           `yaml:"eval_time"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	firesAt, resolvedAt := map[string]time.Duration{}, map[string]time.Duration{}
	for _, tg := range doc.Tests {
		for _, c := range tg.AlertRuleTest {
			at, err := time.ParseDuration(c.EvalTime)
			if err != nil {
				t.Fatalf("%s eval_time %q: %v", c.Alertname, c.EvalTime, err)
			}
			if len(c.ExpAlerts) > 0 {
				if _, ok := firesAt[c.Alertname]; !ok || at < firesAt[c.Alertname] {
					firesAt[c.Alertname] = at
				}
			} else if at > resolvedAt[c.Alertname] {
				resolvedAt[c.Alertname] = at
			}
		}
	}
	for _, r := range rules {
		f, ok := firesAt[r.Alert]
		if !ok {
			t.Errorf("alert %s has no unit test in which it fires", r.Alert)
			continue
		}
		if resolvedAt[r.Alert] <= f {
			t.Errorf("alert %s has no unit test in which it resolves after firing", r.Alert)
		}
	}
}

// TestCheckFiring: the promtool bridge the ops tests use accepts the right
// firing set and refuses a wrong one, both ways.
func TestCheckFiring(t *testing.T) {
	promtool(t)
	ctx := context.Background()
	fams := []*dto.MetricFamily{
		gauge(ops.MetricTopicOldestPending, 90, "topic", "orders"),
		gauge(ops.MetricTopicPending, 70, "topic", "orders"),
		gauge(ops.MetricSoftCap, 100),
		gauge(ops.MetricUp, 1),
	}
	fams[0].Metric = append(fams[0].Metric, gauge(ops.MetricTopicOldestPending, 10, "topic", "payments").Metric...)
	fams[1].Metric = append(fams[1].Metric, gauge(ops.MetricTopicPending, 50, "topic", "payments").Metric...) // 120 in all
	right := map[string][]map[string]string{
		"FerryOutboxBacklogStale": {{"topic": "orders"}},
		"FerryOutboxOverSoftCap":  {{}},
	}
	if err := CheckFiring(ctx, AlertRulesYAML, fams, right); err != nil {
		t.Fatal(err)
	}
	for name, wrong := range map[string]map[string][]map[string]string{
		"missing alert": {"FerryOutboxBacklogStale": {{"topic": "orders"}}},
		"wrong labels":  {"FerryOutboxBacklogStale": {{"topic": "payments"}}, "FerryOutboxOverSoftCap": {{}}},
		"extra alert":   {"FerryOutboxBacklogStale": {{"topic": "orders"}}, "FerryOutboxOverSoftCap": {{}}, "FerryShardsUnowned": {{}}},
	} {
		if err := CheckFiring(ctx, AlertRulesYAML, fams, wrong); err == nil {
			t.Errorf("%s: CheckFiring accepted %v", name, wrong)
		}
	}
	if err := CheckFiring(ctx, AlertRulesYAML, fams, map[string][]map[string]string{"NoSuchAlert": nil}); err == nil {
		t.Error("CheckFiring accepted an alert the file does not define")
	}
}

func TestParseRulesRejects(t *testing.T) {
	for name, src := range map[string]string{
		"unknown key":     "groups:\n  - name: a\n    rulez: []\n",
		"no groups":       "groups: []\n",
		"no severity":     "groups:\n  - name: a\n    rules:\n      - alert: A\n        expr: up == 0\n        annotations: {summary: s}\n",
		"no expr":         "groups:\n  - name: a\n    rules:\n      - alert: A\n        labels: {severity: page}\n        annotations: {summary: s}\n",
		"recording rule":  "groups:\n  - name: a\n    rules:\n      - record: a:b\n        expr: up\n",
		"tab indentation": "groups:\n\t- name: a\n",
		"duplicate key":   "groups: []\ngroups: []\n",
	} {
		if _, err := ParseRules([]byte(src)); err == nil {
			t.Errorf("%s: accepted %q", name, src)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
