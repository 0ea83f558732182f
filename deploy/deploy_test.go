package deploy

import (
	"context"
	"database/sql"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/inbox"
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

	emb, err := natsjs.StartEmbedded(natsjs.WithStoreDir(t.TempDir()))
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

	db := databasesql.New(nil, driver.SQLite)
	if _, err := relay.New(db, pub, relay.WithRegisterer(rec)); err != nil {
		t.Fatalf("relay metrics: %v", err)
	}
	if _, err := cdc.New("postgres://localhost/db", pub, cdc.WithRegisterer(rec)); err != nil {
		t.Fatalf("cdc metrics: %v", err)
	}
	if _, err := inbox.New(db, "deploy-test", func(context.Context, *sql.Tx, ferry.Event) error { return nil },
		inbox.WithRegisterer[*sql.Tx](rec)); err != nil {
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
		"ferry_relay_owned_shards", // relay has no shards
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

func TestEvalEveryRuleAndSemantics(t *testing.T) {
	rules, err := AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if _, err := Eval(r.Expr, nil); err != nil {
			t.Errorf("alert %s is outside the evaluable subset: %v", r.Alert, err)
		}
	}
	fams := []*dto.MetricFamily{
		gauge(ops.MetricTopicOldestPending, 90, "topic", "orders"),
		gauge(ops.MetricTopicOldestPending, 10, "topic", "payments"),
		gauge(ops.MetricPendingTotal, 120),
		gauge(ops.MetricSoftCap, 100),
	}
	fams[0].Metric = append(fams[0].Metric, fams[1].Metric...)
	fams = append(fams[:1], fams[2:]...)
	got, err := Eval(find(t, rules, "FerryOutboxBacklogStale").Expr, fams)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Labels["topic"] != "orders" || got[0].Value != 90 {
		t.Fatalf("backlog alert fired for %+v, want orders at 90", got)
	}
	got, err = Eval(find(t, rules, "FerryOutboxOverSoftCap").Expr, fams)
	if err != nil || len(got) != 1 {
		t.Fatalf("soft cap alert: %+v %v", got, err)
	}
	for _, bad := range []string{"rate(ferry_x[5m]) > 1", "ferry_x + 1", "avg(ferry_x) > 1", "ferry_x{a=~\"b\"} > 1"} {
		if _, err := Eval(bad, fams); err == nil {
			t.Errorf("Eval accepted %q outside the subset", bad)
		}
	}
}

func TestYAMLSubsetRejectsWhatItCannotRead(t *testing.T) {
	for _, src := range []string{
		"groups:\n  - name: a\n    rules: [x]\n",
		"groups:\n  - name: a\n    rules:\n      - alert: A\n        expr: |\n          up\n",
		"groups:\n\t- name: a\n",
		"a: 1\na: 2\n",
	} {
		if _, err := parseYAML(src); err == nil {
			t.Errorf("accepted %q", src)
		}
	}
	v, err := parseYAML("k:\n  - a: \"x # not a comment\"\n    b: 'it''s'\n  - c\n")
	if err != nil {
		t.Fatal(err)
	}
	list := v.(map[string]any)["k"].([]any)
	m := list[0].(map[string]any)
	if m["a"] != "x # not a comment" || m["b"] != "it's" || list[1] != "c" {
		t.Fatalf("parsed %#v", v)
	}
	keys := make([]string, 0)
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "a,b" {
		t.Fatalf("keys %v", keys)
	}
}
