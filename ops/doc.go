// Package ops is the Go API behind Ferry's operator commands (`ferry
// status`, `dlq`, `parked`, `replay`, `cleanup`, `evidence`): it reads and
// changes Ferry's tables the way an operator needs to, safely.
//
// An outbox is an asynchronous boundary: request success rates say nothing
// about it. Operators need to see backlog and lag, act on dead letters and
// parked messages without making things worse, keep the tables small
// without breaking deduplication, and answer "did event X really happen?"
// from the data. Everything here works from the database alone, on
// Postgres and SQLite, whether or not a relay or consumer is running.
//
// # Seeing: Status and Collector
//
// [Ops.Status] is a snapshot: per topic and shard the pending count, the
// oldest pending age, dead letters and the lease holder (owner, fence,
// expiry); per relay instance its live shards and circuit-breaker state (as
// of the relay's last heartbeat, at most one lease tick old); per
// consumer the applied rate, parked messages by reason with the oldest age
// and open gaps; open effect intents by state (pending, in_flight,
// unknown) with the oldest unknown; CDC slot lag. Status.Sections says for
// each part whether it was read, is not installed (none of its tables, and
// its migration not recorded), or failed; a missing or unreadable table
// that should exist fails its section and Status returns ErrStatusIncomplete
// with the rest, so it never reads as zero. Status never scans the bulk of a
// table: the outbox is read through its unsent rows, the inbox by index
// probes per consumer, the effect ledger through its open-intent index —
// so a scrape costs in proportion to the backlog, not to history.
//
// [Collector] exports the same numbers as ferry_ops_* Prometheus gauges at
// scrape time (`ferry status --metrics-addr :9188`). It runs apart from the
// relay on purpose: when the relay stops, its own gauges stop with it,
// which is exactly when "oldest pending age > 60 s" must fire. The alert
// rules and dashboard in deploy/ read these gauges.
//
// # Acting: preview, approve, audit
//
// Every mutating call takes an [Approval]. Without Approve it is a dry run:
// it reports how many rows would change and a sample of them, in a
// transaction that writes nothing. With Approve it needs an Actor and a
// Reason, changes at most [Filter].Limit rows (default
// [DefaultActionLimit]; Result.More says there are more), and writes one
// row to the ops_audit table in the same transaction — who, when, what,
// the filter, the row count, why, and the ids changed. A filter with no
// criterion is refused unless All is set.
//
//   - [Ops.RetryDead]: dead letters back to pending with attempts reset and
//     next_attempt_at now. Ops only writes the row (conditional on status
//     'dead'); the relay that owns the shard publishes it under its own
//     lease and fence.
//   - [Ops.DiscardDead]: mark dead letters discarded (discarded_at, audit
//     id). The row stays, with status 'dead', as evidence; it leaves the DLQ
//     and the dead-letter gauge and becomes deletable by cleanup.
//   - [Ops.Replay]: sent events back to pending, same event ids, so the
//     relay re-publishes them. An inbox consumer absorbs the redelivery as
//     a duplicate unless its inbox row was cleaned up; a consumer without
//     an inbox repeats its effect.
//   - [Ops.RequestReplay], [Ops.RequestReleaseGap]: parked inbox messages.
//     The operator's process has neither the consumer's handler nor its
//     authorization code, so these only mark the rows (replay_requested_at).
//     The consumer process runs [Ops.ServeReplayRequests] next to its inbox;
//     it replays each marked row through inbox.Replay or inbox.ReleaseGap —
//     the live path, with the consumer's current schema, authorization,
//     dedup and cursor checks — clears the mark and audits the outcome. A
//     message whose authorization is still denied stays parked.
//
// # Keeping the tables small: Cleanup and the retention guard
//
// [Ops.Cleanup] deletes sent outbox rows, discarded dead letters (only when
// asked), inbox dedup rows, resolved parked rows and finished effect rows,
// in batches of BatchSize rows selected by primary key, each batch in its
// own short transaction (SKIP LOCKED on Postgres). It never deletes pending
// rows, undiscarded dead letters, open parked messages, inbox cursors or
// open effect intents.
//
// It refuses, with [ErrRetentionTooShort] and a [RetentionError] naming
// both numbers, any retention shorter than the replay [Window]: the
// broker's dedup window and the inbox's replay horizon, stored in the
// ops_settings table ([Ops.SetReplayWindow], audited) and raised — never
// lowered — by [WithMinimumWindow]. Inbox retention must also be at least
// the outbox retention, so every event that can still be replayed from the
// outbox is still remembered by the inboxes. A dedup row deleted while its
// event can still arrive again lets that event be applied twice (DESIGN
// G4); the tests run that premature-cleanup scenario with and without the
// guard. [Ops.RunCleanup] is the scheduled form for a long-running process.
//
// # Outbox capacity
//
// [CapacityGuard] (and the one-shot [CheckCapacity]) let a producer fail
// fast with [ErrOutboxFull] when the outbox holds a hard cap of pending
// rows, instead of filling the disk while the relay is down; the count is
// bounded by the cap and cached for a refresh interval. The soft cap is an
// alert (ferry_ops_outbox_soft_cap vs sum(ferry_ops_outbox_pending)).
//
// # Evidence
//
// [Ops.Evidence] tells, for an event id, a correlation id or a command key,
// what the rows say: committed (outbox row, time, tenant, principal),
// published (status, last receipt, attempts, and how many times: the first
// publish plus every audited replay the relay completed), applied by which
// consumers (inbox rows), parked (reason, attempts, resolution), external
// effects (ledger state, provider operation id, reconciliations) and the
// audit rows that named the event. A table that is not installed is
// reported as missing, never as "did not happen". The CLI prints the same
// structure with --json.
package ops
