package deploy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/metricname"
	"github.com/ferryhq/ferry/internal/metricname/metriclint"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/relay/cdc"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/pgxv5"
)

// builtRegistry is one registry as a Ferry process builds it, with the
// metricname prefixes its components own.
type builtRegistry struct {
	name     string
	reg      *prometheus.Registry
	prefixes []string
}

// ferryRegistries builds every registry Ferry serves — `ferry relay`
// (poll and cdc modes: Go and process collectors plus the relay's),
// a consumer's inbox, an effect worker, and ops.Collector as `ferry status
// --metrics-addr` and the console serve it — over a migrated Postgres
// schema holding one row of every kind, so every family is present:
// ops.Collector and the inbox's gauges read the tables at scrape time,
// and metriclint.Children gives every vector a child.
func ferryRegistries(t *testing.T) []builtRegistry {
	t.Helper()
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	exec := drv.Executor()
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Insert(ctx,
		ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)},
		ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o2", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)},
	); err != nil {
		t.Fatal(err)
	}
	ledger, err := effect.NewLedger(drv)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ferry.NewEventID()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Record(ctx, effect.Intent{Consumer: "billing", EventID: id, Step: "charge", Target: "psp", Operation: "charge"}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE ferry_outbox SET status = 'dead' WHERE aggregate_id = 'o2'`,
		`INSERT INTO ferry_relay_instances (instance_id, shard_count, expires_at) VALUES ('relay-a', 16, now() + interval '1 hour')`,
		`INSERT INTO ferry_relay_leases (shard, owner, fence, expires_at) VALUES (0, 'relay-a', 1, now() + interval '1 hour')
		 ON CONFLICT (shard) DO UPDATE SET owner = EXCLUDED.owner, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at`,
		`INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
		 VALUES ('billing', 'acme', gen_random_uuid(), '\x00', 'order', 'o1', 1, 'order.created', now())`,
		`INSERT INTO ferry_inbox_parked (consumer, reason, park_key, first_seen, last_seen, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type)
		 VALUES ('billing', 'gap', 'k1', now() - interval '10 minutes', now(), 'acme', 'order', 'o3', 2, 'order.created')`,
		`INSERT INTO ferry_cdc_slot (slot_name, publication) VALUES ('ferry_deploy_test', 'ferry_outbox_pub')`,
	} {
		if _, err := exec.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

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

	process := func() *prometheus.Registry { // what `ferry relay` starts from
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		return reg
	}
	var out []builtRegistry
	relayReg := process()
	if _, err := relay.New(drv, pub, relay.WithRegisterer(metriclint.Children{Registerer: relayReg})); err != nil {
		t.Fatalf("relay: %v", err)
	}
	out = append(out, builtRegistry{"ferry relay", relayReg, []string{metricname.Relay}})

	cdcReg := process()
	if _, err := cdc.New(s.URL, pub, cdc.WithRegisterer(metriclint.Children{Registerer: cdcReg})); err != nil {
		t.Fatalf("cdc: %v", err)
	}
	out = append(out, builtRegistry{"ferry relay --mode cdc", cdcReg, []string{metricname.CDC}})

	inboxReg := prometheus.NewRegistry()
	if _, err := inbox.New(drv, "billing", func(context.Context, pgx.Tx, ferry.Event) error { return nil },
		inbox.WithRegisterer(metriclint.Children{Registerer: inboxReg}),
		inbox.WithLag(func(context.Context) (int64, error) { return 3, nil })); err != nil {
		t.Fatalf("inbox: %v", err)
	}
	out = append(out, builtRegistry{"inbox", inboxReg, []string{metricname.Inbox}})

	effectReg := prometheus.NewRegistry()
	if _, err := effect.NewWorker(ledger,
		effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) { return effect.Result{}, nil }),
		effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) { return effect.Status{}, nil }),
		effect.WithRegisterer(metriclint.Children{Registerer: effectReg})); err != nil {
		t.Fatalf("effect: %v", err)
	}
	out = append(out, builtRegistry{"effect worker", effectReg, []string{metricname.Effect}})

	o, err := ops.New(drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opsReg := prometheus.NewRegistry() // as the console serves it
	opsReg.MustRegister(ops.NewCollector(o, ops.WithCaps(100, 1000), ops.WithScrapeTimeout(30*time.Second)), collectors.NewGoCollector())
	out = append(out, builtRegistry{"ferry status --metrics-addr / console", opsReg, []string{metricname.Ops}})
	return out
}

// gatherAll returns the ferry_* families of every registry by name, and
// fails on a name two registries export (one name per fact).
func gatherAll(t *testing.T, regs []builtRegistry) map[string]*dto.MetricFamily {
	t.Helper()
	out := map[string]*dto.MetricFamily{}
	owner := map[string]string{}
	for _, r := range regs {
		fams, err := r.reg.Gather()
		if err != nil {
			t.Fatalf("%s: gather: %v", r.name, err)
		}
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), metricname.Namespace+"_") {
				continue
			}
			if prev, ok := owner[f.GetName()]; ok {
				t.Errorf("%s is exported by both %s and %s", f.GetName(), prev, r.name)
			}
			owner[f.GetName()], out[f.GetName()] = r.name, f
		}
	}
	return out
}

// TestMetricsLint runs client_golang's promlint over every registry Ferry
// builds, each with every family present, and fails on any problem, on a
// family without HELP and on a ferry_ name outside its component's prefix.
func TestMetricsLint(t *testing.T) {
	regs := ferryRegistries(t)
	for _, r := range regs {
		fams, err := r.reg.Gather()
		if err != nil {
			t.Fatalf("%s: gather: %v", r.name, err)
		}
		problems, err := metriclint.Problems(fams, r.prefixes...)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", r.name, p)
		}
	}
	// Every described family is gathered (so the lint saw it): a vector
	// without children or a collector that skipped a family would hide
	// its problems.
	gathered := gatherAll(t, regs)
	for name := range exportedMetrics(t) {
		if _, ok := gathered[name]; !ok {
			t.Errorf("%s is described but was not gathered, so promlint did not see it", name)
		}
	}

	// The lint can fail: a gauge named _total, a counter without it, a
	// non-base unit and a missing HELP are each reported.
	bad := prometheus.NewRegistry()
	bad.MustRegister(
		prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.Ops + "outbox_pending_total", Help: "a gauge named like a counter"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "published", Help: "a counter without _total"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.Relay + "lag_milliseconds", Help: "not a base unit"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.Relay + "nohelp"}),
	)
	fams, err := bad.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := metriclint.Problems(fams, metricname.Relay)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(problems, "\n")
	for _, want := range []string{
		"ferry_ops_outbox_pending_total: non-counter metrics should not have \"_total\" suffix",
		"ferry_relay_published: counter metrics should have \"_total\" suffix",
		"ferry_relay_lag_milliseconds: use base unit \"seconds\" instead of \"milliseconds\"",
		"ferry_relay_nohelp: no HELP",
		"ferry_ops_outbox_pending_total: not under the registry's prefixes",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("the lint missed %q; it reported:\n%s", want, joined)
		}
	}
}

// docMetric is one row of the metrics table in docs/OPERATIONS.md.
type docMetric struct{ typ, labels string }

var docRowRE = regexp.MustCompile("^\\| `(ferry_[a-z0-9_]+)` \\| (counter|gauge|histogram|summary) \\| ([^|]*) \\| [^|]+ \\|$")

// docMetrics parses the table under "## Metrics" in docs/OPERATIONS.md.
func docMetrics(t *testing.T) map[string]docMetric {
	t.Helper()
	src, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "\n## Metrics\n")
	if !ok {
		t.Fatal(`docs/OPERATIONS.md has no "## Metrics" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	out := map[string]docMetric{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `ferry_") {
			continue
		}
		m := docRowRE.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("metrics table row not in the form | `name` | type | labels | meaning |: %s", line)
			continue
		}
		if _, dup := out[m[1]]; dup {
			t.Errorf("docs/OPERATIONS.md lists %s twice", m[1])
		}
		out[m[1]] = docMetric{typ: m[2], labels: normLabels(m[3])}
	}
	if len(out) < 20 {
		t.Fatalf("parsed %d metrics from docs/OPERATIONS.md, want the whole table", len(out))
	}
	return out
}

// normLabels turns "`a`, `b`" or "–" into "a,b" (sorted) or "".
func normLabels(s string) string {
	var ls []string
	for _, f := range strings.Split(s, ",") {
		f = strings.Trim(strings.TrimSpace(f), "`")
		if f != "" && f != "–" && f != "-" {
			ls = append(ls, f)
		}
	}
	sort.Strings(ls)
	return strings.Join(ls, ",")
}

// TestOperationsDocListsEveryMetric: the table in docs/OPERATIONS.md and
// the families Ferry exports agree both ways, with type and labels.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	doc := docMetrics(t)
	got := gatherAll(t, ferryRegistries(t))
	for _, m := range docMismatches(doc, got) {
		t.Error(m)
	}
	// The comparison can fail both ways: a row dropped from the table, a
	// row for a metric nobody exports and a wrong type are each noticed.
	broken := maps.Clone(doc)
	delete(broken, metricname.Relay+"published_total")
	broken[metricname.Relay+"published"] = docMetric{typ: "counter"}
	broken[metricname.Ops+"up"] = docMetric{typ: "counter"}
	if n := len(docMismatches(broken, got)); n != 3 {
		t.Fatalf("broken table: %d mismatches, want 3: %v", n, docMismatches(broken, got))
	}
}

func docMismatches(doc map[string]docMetric, got map[string]*dto.MetricFamily) []string {
	var out []string
	for name, f := range got {
		d, ok := doc[name]
		if !ok {
			out = append(out, name+" is exported but not listed in docs/OPERATIONS.md")
			continue
		}
		if typ := strings.ToLower(f.GetType().String()); typ != d.typ {
			out = append(out, fmt.Sprintf("%s: docs say %s, exported as %s", name, d.typ, typ))
		}
		var ls []string
		for _, lp := range f.GetMetric()[0].GetLabel() {
			ls = append(ls, lp.GetName())
		}
		sort.Strings(ls)
		if l := strings.Join(ls, ","); l != d.labels {
			out = append(out, fmt.Sprintf("%s: docs list labels %q, exported with %q", name, d.labels, l))
		}
	}
	for name := range doc {
		if _, ok := got[name]; !ok {
			out = append(out, "docs/OPERATIONS.md lists "+name+", which no Ferry registry exports")
		}
	}
	sort.Strings(out)
	return out
}
