// Package inbox is the consumer half of Ferry: it applies each event's
// effect once (per consumer, tenant and event id) inside the consumer's own
// database transaction, in per-aggregate order, and parks what it cannot
// apply instead of dropping it (guarantees G3 and G4).
//
// # Why an inbox
//
// Brokers deliver at least once. A consumer that applies an event and then
// acks can crash in between; the broker redelivers and the effect happens
// twice. A consumer that acks first can crash before applying; the effect
// is lost. The inbox removes the window: the dedup claim, the
// per-aggregate cursor and the handler's effect are written in one
// transaction, and the broker is acked only after it committed. A crash
// before the commit rolls all three back (the redelivery applies the
// event); a crash after it leaves a claim that absorbs the redelivery.
//
// # Using it
//
//	ib, err := inbox.New[pgx.Tx](pgxv5.New(pool), "shipping",
//		func(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
//			_, err := tx.Exec(ctx, `INSERT INTO shipments ...`, ...)
//			return err
//		},
//		inbox.WithSchemas(inbox.SchemaKey{EventType: "order.paid", SchemaVersion: 1}),
//		inbox.WithAuthorizer[pgx.Tx](checkPolicy),
//		inbox.WithRegisterer(prometheus.DefaultRegisterer),
//	)
//	consumer, err := natsjs.DialConsumer(ctx, url, "ORDERS", "shipping")
//	err = ib.Run(ctx, consumer) // until ctx is cancelled
//
// The handler gets the transaction in the caller's own type (pgx.Tx,
// *sql.Tx), through the same [github.com/ferryhq/ferry/driver] seam the
// outbox uses, so Postgres via pgx, Postgres via database/sql and SQLite
// share one core. [Inbox.Run] takes any [github.com/ferryhq/ferry/broker.Consumer]:
// NATS JetStream, Kafka and RabbitMQ adapters all work.
//
// # What happens to a message, in order
//
//  1. Decoding and limits: a message the adapter could not decode (for
//     example a CloudEvents attribute given twice), whose fields would
//     break the inbox's own writes, or whose event is outside the
//     consumer's [WithLimits] (the producer's validation and defaults:
//     payload size, content types, name and header lengths) is parked as
//     undecodable with the reason naming the attribute or field and the
//     limit, its raw headers and body (bounded by [WithMaxRawBytes]), and
//     acked — never applied, never dropped.
//  2. Contract: an (event type, schema version) not declared with
//     [WithSchemas] is parked as schema: replayable after an upgrade.
//  3. Claim and cursor, one round trip on Postgres: if (consumer, tenant,
//     event id) was applied before with the same fingerprint, the message is
//     a duplicate (acked, counted, no effect); with a different fingerprint it
//     is a collision (parked with both fingerprints, logged at error level,
//     counted; the original effect is untouched — see "Which copy is the
//     original" below). Otherwise the aggregate's
//     cursor decides: a sequence at or below it is stale (skipped, counted);
//     more than one above it is a gap (parked, acked); the next one is
//     claimed and the cursor advanced, under the cursor row's lock.
//  4. Authorization: the [Authorizer] runs in the same transaction and can
//     read current state; possession of a message grants nothing. A denial
//     undoes the claim and parks the message as unauthorized.
//  5. The handler. An error rolls everything back and the message is nacked
//     with exponential backoff and full jitter; an error wrapped with
//     [Permanent], or the attempt that reaches [WithMaxAttempts], parks it
//     as poison instead, in a transaction of its own, and acks it.
//  6. Gap successors: when the applied event fills a gap, its parked
//     successors are applied right after it, in order, in the same
//     transaction (each under a savepoint, so a failing successor stays
//     parked without undoing its predecessor).
//  7. Commit, then ack.
//
// # Fingerprint
//
// [Fingerprint] is SHA-256 over a length-prefixed canonical envelope —
// event id, tenant, aggregate type, id and sequence, event type, schema
// version, content type — and the payload. Trace and provenance headers,
// topic and times are left out: a relay may re-stamp them on a re-publish
// without changing what the event means.
//
// # Ordering and its policies
//
// The cursor is per (consumer, tenant, aggregate type, aggregate id). By
// default ([StartStrict]) an aggregate the consumer has never seen must
// start at sequence 1; a consumer started after its producer (with the
// broker's retention no longer holding the early events) uses
// [StartAtFirstSeen]. Consumers whose effects commute opt out with
// [WithoutOrdering]: then only dedup applies. An open gap older than
// [WithGapAlert] shows in ferry_inbox_gaps_overdue; when the missing event
// is known lost, [Inbox.ReleaseGap] moves the cursor past it.
//
// # Concurrency
//
// Run hashes each aggregate to one of [WithWorkers] workers, so one
// aggregate's events are applied serially in broker order while different
// aggregates run in parallel. Each worker's queue is bounded ([WithQueue]);
// when full, Run stops pulling from the broker. Several processes may run
// the same consumer name: the claim's unique key and the cursor's row lock
// keep them consistent, and a lost race is retried at once. On
// cancellation Run finishes (or, after [WithDrainTimeout], rolls back) the
// transactions in flight, leaves queued messages to the broker's
// redelivery, and returns; it starts and stops all of its goroutines.
//
// # Which copy is the original
//
// Two messages with the same (tenant, event id) and different content
// mean a producer reused an event id. The original is the copy whose claim
// commits first; the other parks as a collision. Run makes that the copy
// delivered first (the stream order of a JetStream stream, the order of
// one Kafka partition or one queue): a message whose (tenant, event id) is
// still queued or being processed on another worker — copies on different
// aggregates hash to different workers — is not handed to its worker until
// that worker has finished the earlier copy. What the rule cannot cover,
// because an applied effect is never undone: an earlier copy that was not
// applied at its delivery (rolled back for a retry, or parked as gap,
// schema, unauthorized or poison) does not hold its place, so a later copy
// applied before it is retried, healed or replayed is the original; and
// copies delivered to different processes of one consumer name, or from
// different Kafka partitions (no order between them), are decided by
// whichever claim commits first.
//
// # Batch mode
//
// [WithBatch] applies up to N queued messages of a worker in one
// transaction and acks them all after the commit. The batch first runs
// optimistically: on Postgres its claims and cursors are read (and locked)
// in one statement and written in another, then the handlers run. If any
// message has to be undone (handler error, denial, a race lost to another
// instance), nothing is committed and the batch runs again with a
// savepoint per message — a message that fails rolls back to its savepoint
// and never takes its neighbours' claims with it. Batching trades latency,
// and a larger set of redeliveries after a crash (all absorbed), for
// throughput.
//
// # Parked messages and the operator's API
//
// Parked rows keep the reason, attempts, first and last seen, the sanitised
// error text and the full envelope and payload. [Inbox.ListParked] and
// [Inbox.GetParked] read them; [Inbox.Replay] runs them through the live
// path again (schema, authorization, dedup, cursor, handler — never around
// the inbox) in a transaction each; [Inbox.DryRun] reports what a replay
// would do without calling the handler or writing anything;
// [Inbox.ReleaseGap] gives up on missing events; [Inbox.HealGaps] applies
// gap successors whose predecessor arrived through another instance (Run
// calls it every [WithHealInterval]). A redelivered or replayed message
// updates its open row rather than adding one.
//
// # Faults and proofs
//
// [Faults] hooks simulate a crash before the commit or after the commit
// and before the ack; `ferry prove` uses them. The tests include the
// negative control the contract asks for: an inbox that claims in one
// transaction and applies in another loses the effect under the same
// crash.
//
// # Metrics
//
// With [WithRegisterer], the ferry_inbox_* series are exported, labelled
// with the consumer name; docs/INBOX.md lists them with suggested alerts.
// Counters are per process; the parked and gap gauges are queried from the
// database at scrape time, so they agree across instances.
//
// # What the inbox does not do
//
// It does not make external side effects (HTTP, email) exactly once: keep
// them out of the handler and go through the effect ledger. It does not
// clean up claims: the claim must outlive the broker's redelivery and any
// replay window, or an old event would apply again.
package inbox
