// Package deploy is Ferry's observability pack: Prometheus alert rules
// (prometheus/ferry-alerts.yml) and a Grafana dashboard
// (grafana/ferry-dashboard.json), embedded so tools and tests read the
// exact files operators install.
//
// Two promises are tested rather than hoped for:
//
//   - Every ferry_* metric an alert or a panel reads is exported by some
//     Ferry package. deploy_test.go builds each package's metric set
//     (ops.Collector, the relay, the CDC relay, the inbox, the effect
//     worker) on a fresh registry, collects the names from their
//     descriptors and fails on any name no package exports — so renaming
//     a metric without updating the pack breaks the build, not the pager.
//   - The alerts fire when they should. [Eval] evaluates a rule's
//     expression against gathered metrics the way Prometheus would at one
//     instant; the ops tests stop a real relay, watch the backlog alert's
//     expression cross its threshold, restart the relay and watch it
//     recover.
//
// Eval understands only the PromQL subset the rule file is written in
// (selectors with = and != matchers, max/min/sum/count with by, and
// comparisons with numbers or other aggregates); a rule outside it fails
// the tests, so the subset cannot silently drift from the rules. Likewise
// the rule file is parsed by a small block-YAML reader (no YAML module is
// in go.sum) that rejects anything outside its subset with the line number.
//
// Most alerts read the ferry_ops_* gauges of [github.com/ferryhq/ferry/ops.Collector],
// computed from the tables at scrape time by `ferry status --metrics-addr`;
// they keep working while a relay or consumer is down, when the
// processes' own gauges disappear. Thresholds are starting points: the
// runbooks in docs/OPERATIONS.md say what each alert means and what to do.
package deploy
