// Package metricname is the one place Ferry's Prometheus metric names are
// built from: every name is ferry_<subsystem>_<name>, written as one of the
// prefixes below followed by the rest of the name, so each name is a
// constant a reader can grep for in full.
//
// Which component exports which fact is decided once (docs/OPERATIONS.md,
// "Metrics"): facts read from Ferry's tables are exported by ops.Collector
// (Ops); a component exports only what exists in its own process.
package metricname

// Namespace is the first part of every Ferry metric name.
const Namespace = "ferry"

// The prefixes, one per subsystem (Namespace + "_" + subsystem + "_").
const (
	Relay  = "ferry_relay_"  // package relay: the polling relay's own work
	CDC    = "ferry_cdc_"    // package relay/cdc: the logical-replication relay
	Inbox  = "ferry_inbox_"  // package inbox: one consumer's own work
	Effect = "ferry_effect_" // package effect: the effect worker's own work
	Ops    = "ferry_ops_"    // package ops: facts read from the tables at scrape time
	Prove  = "ferry_prove_"  // package prove: the reference pipeline of a scenario
)

// Prefixes lists every prefix, for tests that check a name's subsystem.
func Prefixes() []string { return []string{Relay, CDC, Inbox, Effect, Ops, Prove} }
