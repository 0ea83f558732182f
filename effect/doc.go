// Package effect is Ferry's effect ledger: guarantee G5, "external side
// effects are never retried blind".
//
// The inbox makes an event's effect inside the consumer's own database
// happen once per (consumer, event). A call to an outside system — a payment
// provider, an email API, another service — cannot join that transaction,
// and a timeout leaves it unknown whether the call happened. Calling it
// inline from the handler and retrying on error is how customers get charged
// twice (this package's tests show exactly that as a negative control).
//
// # A downstream outbox
//
// Inside the handler, do not call the outside system: record an [Intent] in
// the handler's transaction with [Ledger.RecordTx]. The intent commits with
// the handler's other writes and the inbox claim, or not at all. Its
// idempotency key is derived from (consumer, event id, step) by [Key]:
//
//	"fx1_" + hex(SHA-256("ferry.effect.v1" 0x00 consumer 0x00 event_id 0x00 step))
//
// so a redelivered handler records the same key (a no-op), and the outside
// system can deduplicate every attempt. This package does not depend on the
// inbox: any code holding a transaction can record intents.
//
// # The worker and its state machine
//
// A [Worker] claims due intents under a lease and drives each one:
//
//	pending ──(attempt committed before the call)──► in_flight
//	in_flight ──2xx / nil error──────────────────────► succeeded (operation id, summary)
//	in_flight ──ErrRejected (4xx-class)──────────────► failed (compensation is the caller's)
//	in_flight ──ErrNotSent (never connected)─────────► pending (backoff; failed when attempts run out)
//	in_flight ──timeout, reset, 5xx, any other error─► unknown
//	in_flight with an expired lease (worker died)────► unknown
//	unknown ──Reconciler: found──────────────────────► succeeded
//	unknown ──Reconciler: not found──────────────────► pending → executed again with the SAME key
//	unknown ──Reconciler: unknown / error────────────► unknown (backoff, ask again)
//
// The move to in_flight is committed before the call, so a worker killed
// mid-call leaves evidence that the call may have happened; the next worker
// to claim the row after the lease expires treats it as unknown and
// reconciles. An unknown intent is never executed again before a status
// query answered "not found": that is G5. That status query is not sent
// before the attempt's lease has run out, not even by a live worker whose
// call timed out: until then the attempt's request may still be on its way
// to the provider, and a "not found" would be premature. A provider that
// does not deduplicate by key must also refuse requests that arrive after
// their deadline (the call context's deadline); see docs/EFFECTS.md.
//
// # Protection against retry storms
//
// Per target ([Intent].Target) the worker holds a concurrency limit
// ([WithTargetConcurrency]), a token-bucket rate limit ([WithTargetRate],
// golang.org/x/time/rate) shared by executions and status queries, and a
// circuit breaker ([WithBreaker]) that opens after consecutive unclear or
// unsent calls and lets one probe through per cooldown. While it is open,
// due intents wait without spending attempts. Execution attempts are bounded
// ([WithMaxAttempts]); retries wait full-jitter backoff ([WithBackoff]).
// Unknown intents are never failed by the bound — they may have happened —
// and are reconciled with capped backoff until the outside system answers;
// their age is the metric to alert on.
//
// # Executors and reconcilers
//
// [Executor] and [Reconciler] are the plug points; errors classify outcomes
// ([NotSent], [Rejected], anything else is unknown — unclassified means
// unsure, never "safe to retry"). Package
// [github.com/ferryhq/ferry/effect/effecthttp] implements both for HTTP APIs
// that honour Idempotency-Key; SMTP or gRPC clients implement the two
// one-method interfaces the same way.
//
// # Evidence and metrics
//
// Every ledger row keeps its event id, consumer and step; [ByEvent] and
// [ByKey] return state, provider operation id, attempts, reconciliations and
// timestamps, e.g. "payment captured, provider id ch_42, at T". [Ledger.Stats]
// counts intents by state and the age of the oldest unknown one; ops.Collector
// exports the open ones as ferry_ops_effects{consumer,state} and
// ferry_ops_effects_oldest_unknown_age_seconds{consumer}. With
// [WithRegisterer] the worker exports what only it knows:
// ferry_effect_reconciliations_total{target,outcome},
// ferry_effect_attempts_total{target,outcome},
// ferry_effect_attempts_per_effect{target,state},
// ferry_effect_released_total{target,reason},
// ferry_effect_breaker_state{target,state} (1 for the current state) and
// ferry_effect_breaker_transitions_total{target,to} (docs/OPERATIONS.md
// lists every metric).
// Logs carry keys and ids, never request or response bodies.
//
// # Crash experiments
//
// [Faults] holds hooks that are nil (and free) by default.
// Faults.AfterExecuteBeforeRecord runs between the call and the ledger
// write; returning an error, blocking or killing the process reproduces a
// crash at the worst moment. The tests kill a worker process with SIGKILL
// there and show that the restarted worker finds the charge by
// reconciliation and never charges twice.
//
// # Stores
//
// The ledger lives in the effects table (migration 0004) and runs on every
// Ferry driver — pgx, database/sql on Postgres, SQLite — through one core.
// On Postgres claims use FOR UPDATE SKIP LOCKED, so many workers share a
// ledger; on SQLite the database write lock serialises them.
package effect
