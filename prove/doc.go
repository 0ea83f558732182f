// Package prove runs Ferry's crash matrix: the whole pipeline — producer →
// outbox → relay → broker → inbox consumer → effect ledger → payment
// provider — once per scenario, under injected faults, and reports what
// happened as figures measured from ground truth. It is the library behind
// `ferry prove` and `ferry demo`.
//
// # Why a checker, and why it must be able to fail
//
// Every outbox library promises at-least-once delivery and effectively-once
// effects; almost none ships a way to check the promise against a real
// stack. prove writes a seeded workload (an order flow — create, pay, ship,
// cancel — over many tenants and aggregates, with deliberate rollbacks,
// multi-event transactions and producers racing on one aggregate), injects
// faults at the dangerous points, waits for the pipeline to settle, and then
// compares what the business committed with what the broker stored, what
// the consumer applied and what the provider charged. A checker that cannot
// fail proves nothing, so prove also runs negative controls — deliberately
// broken pipelines (naive dual write, mark-sent-before-ack, a non-atomic
// inbox, cleanup shorter than the replay window, an external call without
// the ledger) — and a run fails if any control shows no violation.
//
// # Ground truth, never self-report
//
// Figures come from:
//   - the business table the producer commits in the same transaction as
//     the outbox rows: what committed;
//   - the outbox table: sequence numbers and occurred_at;
//   - the broker's stream, read message by message from the broker: what was
//     published, how many copies, and the broker's own timestamps (lag);
//   - the consumer's applied log, a table without a unique constraint so a
//     duplicate effect stays visible, and the inbox's parked table;
//   - the fake provider's own books: every charge it executed;
//   - prove's counting wrappers around the real broker client: every publish
//     call and every delivery.
//
// Nothing is taken from a component's counters or log lines (the one
// exception, reported as such, is the relay's count of fenced writes).
//
// # Classes
//
// Each planned event is classified like a Jepsen checker: ok (applied once),
// recovered (applied once after a fault touched it: republished,
// redelivered, healed from a gap, reconciled), duplicated (applied more than
// once), lost (committed, never applied nor parked, and nothing can still
// deliver it), undelivered (committed, not applied nor parked when the
// settle budget ran out, but still held by the broker for the consumer or
// unsent with a relay that will send it: slow, not lost — read from the
// broker: JetStream's ack floor, Kafka's committed offsets, a RabbitMQ
// queue's depth), unknown (held in the parked table for no planned reason)
// and unexpected (applied though it must not be: rolled back, unauthorised,
// wrong schema, poison). A scenario settles until every committed event is
// accounted for, or until the broker says nothing missing can still
// arrive, or until its budget (WithDuration) is spent.
//
// # Fault injection
//
// In-process faults go through the components' own hooks (relay.Faults:
// crash after publish before mark; inbox.Faults: crash after commit before
// ack, crash before commit; effect.Faults: crash after the provider
// succeeded, before the ledger write), fire at event positions drawn from
// the seed, and fire once per event. Process-level faults run the relay,
// the consumer (package inbox) or the effect worker (package effect) as a
// subprocess (WithWorkerCommand, RunWorker): SIGKILLed at seeded moments
// and restarted; a relay can also be frozen with SIGSTOP mid-batch past its
// lease expiry and then resumed, when its late marks must be fenced. A
// subprocess opens the scenario's database itself (the SQLite file in WAL
// mode, or the Postgres schema). The fake provider stays in the parent —
// its books are the ground truth — and subprocess effect workers reach it
// over loopback HTTP through package effect/effecthttp; it holds each
// charge's response briefly after applying it, and some kills are aimed
// at that window, between the provider's success and the ledger's record.
// Network faults use
// internal/faultproxy, a TCP proxy in front of the broker (or of Postgres,
// for the relay's connections) that black-holes,
// drops, delays and resets connections.
//
// # Which components are real
//
// Ferry's real code runs in every scenario except where a control needs a
// broken part: the outbox writer, migrations, CloudEvents encoding,
// package relay (in-process, and as the SIGKILLed or frozen subprocess),
// package relay/cdc (the CDC scenarios, on Postgres),
// package inbox (the consumer runtime, with its authorizer, schema check,
// gap parking and healing; also as a SIGKILLed subprocess), package effect
// (ledger and worker, with a status-query reconciler; also as SIGKILLed
// subprocesses with package effect/effecthttp) and package ops (cleanup and its retention
// guard), over NATS JetStream (broker/natsjs), Kafka (broker/kafka, real
// or franz-go's kfake) or RabbitMQ (broker/rabbitmq). prove's own parts
// are the readers of what each broker stored, the fake payment
// provider (it does not deduplicate, so a blind retry shows as a second
// charge), the naive
// producer of the dual-write control, and the broken inbox of the
// non-atomic control (package inbox has no public switch to break itself).
// prove also carries a reference relay and a reference inbox + effect
// ledger (WithReferenceRelay, WithReferenceInbox): a second implementation
// of the same contract, used to cross-check the real ones.
// Result.Components lists, per scenario, exactly what ran.
//
// # Reproducibility
//
// A fixed seed fixes the workload and the fault plan, so the figures
// returned by [Figures.Deterministic] repeat exactly. Timing-dependent
// figures (lag, how many duplicates a crash caused, call counts, ages) are
// reported but not part of that promise.
//
// See docs/PROVE.md for every figure and for running against your own stack.
package prove
