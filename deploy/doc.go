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
//   - The alerts fire when they should, as Prometheus evaluates them —
//     no PromQL is reimplemented here. prometheus/ferry-alerts_test.yml
//     holds promtool rule unit tests in which every alert fires from
//     synthetic series once its "for" has passed and then resolves
//     (TestAlertRuleUnitTests runs `promtool check rules` and
//     `promtool test rules`, and TestEveryAlertHasUnitTest fails when an
//     alert has no such test). [CheckFiring] hands series gathered from a
//     real Ferry registry to promtool: the ops tests stop a real relay,
//     check the backlog alert selects the stalled topic, restart the relay
//     and check it clears.
//
// The rule file is parsed with gopkg.in/yaml.v3 (unknown keys refused).
// promtool comes from Prometheus (the Debian package prometheus; .ci/run
// installs it); without it those tests skip, or fail when
// FERRY_REQUIRE_SERVICES=1.
//
// Most alerts read the ferry_ops_* gauges of [github.com/ferryhq/ferry/ops.Collector],
// computed from the tables at scrape time by `ferry status --metrics-addr`;
// they keep working while a relay or consumer is down, when the
// processes' own gauges disappear. Thresholds are starting points: the
// runbooks in docs/OPERATIONS.md say what each alert means and what to do.
package deploy
