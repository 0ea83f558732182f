// Package relay publishes committed outbox rows to a broker: at least once
// (guarantee G2), in per-aggregate order (G3), and marks a row sent only
// after the broker acknowledged it. It is the polling relay of DESIGN §5;
// `ferry relay` runs it as a process.
//
//	r, err := relay.New(pgxv5.New(pool), publisher,
//		relay.WithShardCount(16),
//		relay.WithListener(pool, "ferry_outbox"), // producers use outbox.WithNotify("ferry_outbox")
//		relay.WithRegisterer(prometheus.DefaultRegisterer),
//	)
//	if err != nil { … }
//	err = r.Run(ctx) // until ctx is cancelled; releases its leases on the way out
//
// # Shards, leases and fences
//
// Every outbox row carries shard = hash(tenant, aggregate) mod N, fixed at
// write. Relays divide the N shards between them through a lease table
// (migration 0002): one row per shard with an owner, an expiry on the
// database clock and a fence token that only ever increases. Each relay
// heartbeats into an instances table every TTL/3; with L live relays each
// takes about ceil(N/L) shards, releases what exceeds that share (between
// batches, so nothing in flight is stranded), and picks up free or expired
// leases up to it. A graceful stop releases every lease at once; a crashed
// relay's leases are taken over when they expire, by a relay that bumps
// the fence.
//
// The fence is what makes takeover safe. Every state change the relay
// writes — mark sent, schedule a retry, dead-letter — is one UPDATE joined
// to the lease row and conditional on "owner = me AND fence = the fence I
// claimed with AND the lease has not expired". A relay that was paused (GC,
// a frozen VM, a partition) across its lease expiry wakes up to find its
// writes rejected: zero rows updated, counted in
// ferry_relay_fenced_writes_total. It may still have published the batch;
// the new owner publishes it again under the same event ids, which is a
// duplicate, never a loss or an overwrite. TestFenceNegativeControl shows
// the overwrite that happens without the fence.
//
// A relay configured with another N than the rows it could still publish
// carry — pending rows and dead letters that are not discarded — refuses to
// start ([ErrShardCountMismatch], naming both numbers, how many rows of
// each kind, and the commands that clear them): changing N needs a drain,
// like repartitioning Kafka. Sent rows and discarded dead letters do not
// count.
//
// # Claiming
//
// A cycle claims, for every owned shard, the first k pending rows that are
// due (next_attempt_at <= now) in id order, k = batch size / owned shards.
// Rows are selected by status, never by "id above the last one seen":
// identity values are allocated at insert and commit out of order, so such
// a cursor skips a late-committing row forever (TestLateCommitIsPublished).
//
// Head-of-line blocking is per aggregate, not per shard: a row is not
// claimed while an earlier row of its aggregate is unsent and either
// backing off or dead (under [DeadHold]). An earlier row that is due is
// always in the same batch, ahead of it, because per aggregate id order is
// sequence order (the producer allocates both under the aggregate's row
// lock). Other aggregates of the shard proceed.
//
// No row lock (FOR UPDATE SKIP LOCKED) is taken on outbox rows: a shard has
// one owner, and the fence makes a second, stale owner harmless. Locking
// would cost a write per claimed row and buy nothing. Lease acquisition
// does use SKIP LOCKED, so relays racing for free shards do not queue.
//
// # Publish, confirm, mark
//
// The batch goes to [broker.Publisher.Publish] in one call (the adapter
// pipelines it and waits for every acknowledgement), then all successes are
// marked sent in one statement storing published_at and the broker
// receipt. Failures are classified with [broker.ClassOf]:
//
//   - not sent / indeterminate: attempts+1, next_attempt_at = now + a delay
//     drawn uniformly from [0, min(max, base·2^(attempts-1))] (full
//     jitter), last_error = the error text only (never payload), control
//     characters removed, at most 512 bytes.
//   - not sent marked [broker.ErrDestinationMissing] (a Kafka topic that
//     does not exist, a NATS subject no stream captures, a RabbitMQ routing
//     key no queue is bound to): a configuration fault, not a poison
//     event. The row is held: no attempt charged (so it never goes dead
//     for it), next_attempt_at = now + a delay that grows per destination
//     from the backoff base to the probe max (uniform in [ceil/2, ceil]),
//     and the destination is reported (ferry_relay_destination_missing,
//     [Status].MissingDestinations, a warning log with alert=
//     destination_missing) until a publish to it succeeds.
//   - not sent / indeterminate on a destination that accepted no event
//     within one probe max while the broker answers its ping (a stream
//     without a quorum, a partition without a leader): held the same way,
//     reported by ferry_relay_destination_unavailable and alert=
//     destination_unavailable (worker.go, holdUnavailable).
//   - permanent (too large, invalid subject), or attempts reaching the maximum:
//     status dead, with the reason. Under [DeadHold] (the default) the
//     aggregate's later events wait for an operator (`ferry dlq`); under
//     [DeadSkip] they flow and consumers see a gap.
//
// Within a batch, once an aggregate has a failed row its later rows are
// left untouched: never marked sent ahead of it, and not charged an
// attempt. The adapter may already have delivered them (they were
// pipelined behind the failed one); they are published again after it, and
// the broker's dedup (JetStream's Nats-Msg-Id window) or the consumer's
// sequence cursor absorbs the copy. To keep that window small, a row that
// has failed before is published alone for its aggregate: later events of
// an aggregate are only pipelined behind rows not known to fail.
//
// # Broker outages
//
// When rows fail transiently, the relay pings the broker before charging
// anything. If the ping fails too, the broker is down: the circuit breaker
// opens, the transient failures are not written (no attempts burned, so an
// outage never moves a row towards dead), and the relay sends nothing but
// pings, at an interval doubling from the probe base to its cap. The first
// successful ping closes the breaker and publishing resumes. Broker calls
// are counted (ferry_relay_broker_calls_total{op}); the outage tests
// assert the bound against embedded NATS, kfake and RabbitMQ behind a TCP
// proxy.
//
// # Wake-up
//
// Three sources, any of which starts a cycle: Postgres LISTEN on a
// dedicated connection ([WithListener]; the producer's
// outbox.WithNotify makes its insert pg_notify at commit), the in-process
// [Relay.Notify] (SQLite and the embedded stack call it after commit), and
// polling ([WithPollInterval]) as the fallback that always works. A cycle
// that filled a shard's share of the batch runs again at once.
//
// # Crash safety and fault hooks
//
// [Faults] hooks stop the relay at the dangerous points (before publish,
// after publish before mark). Returning an error there simulates a crash:
// [Relay.Run] returns an error wrapping [ErrFaultInjected] without marking
// and without releasing leases. After a restart the same rows are published
// again under the same event ids (TestCrashBetweenPublishAndMark counts
// them as JetStream duplicates). `ferry prove` drives these hooks.
//
// # Observability
//
// Metrics (names are a contract; docs/OPERATIONS.md lists every Ferry
// metric): the relay exports only its own work — ferry_relay_published_total,
// ferry_relay_duplicates_total, ferry_relay_publish_latency_seconds,
// ferry_relay_retries_total, ferry_relay_dead_total,
// ferry_relay_fenced_writes_total, ferry_relay_breaker_state{state},
// ferry_relay_broker_calls_total{op}, ferry_relay_batches_total,
// ferry_relay_cycle_phase_seconds{phase}, ferry_relay_destination_missing,
// ferry_relay_destination_unavailable.
// The backlog, dead letters and leases are facts of the tables, exported
// once by ops.Collector (ferry_ops_outbox_*, ferry_ops_relay_*).
// Logs (log/slog) carry event_id, aggregate, aggregate_seq, attempts and
// relay_instance, never payloads. [Relay.Status] backs health checks;
// [Status.Ready] is the readiness rule `ferry relay` serves on /readyz.
package relay
