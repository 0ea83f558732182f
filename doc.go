// Package ferry is the user API of Ferry, a transactional outbox / inbox
// toolkit for Go: the event model ([Event], [Headers]), its validation
// ([Limits]), where the tables live ([Tables]), how events are routed
// ([TopicTemplate], [ShardFor]) and the errors callers branch on
// ([ErrInvalidEvent], [ErrSequenceConflict], [ErrDuplicateEventID],
// [ErrInvalidConfig]).
//
// # The data flow
//
//	command ──► producer tx ─┬─ business rows
//	                         └─ outbox row               (package outbox)
//	                                   │ commit
//	relay: poll + wake-up, or CDC from the WAL           (package relay, relay/cdc)
//	   owns shards by lease + fence ──► broker           (broker/natsjs, broker/kafka, broker/rabbitmq)
//	   marks sent after the broker's ack                 CloudEvents binary mode (broker/cloudevents)
//	                                   │
//	consumer tx ─┬─ inbox claim (consumer, event id)     (package inbox)
//	             ├─ per-aggregate cursor: stale → skip, gap → park
//	             ├─ business effect (+ effect intents)   (package effect, effect/effecthttp)
//	             commit ──► ack
//
// # The guarantees
//
// The godoc of every package cites these by number; README.md's table
// says when each holds and what tests it.
//
//   - G1: an event row exists if and only if its business transaction
//     committed. The outbox row is written in the caller's transaction
//     (outbox.Writer.InsertTx); a failed call leaves nothing behind.
//   - G2: every committed event is published at least once, while a relay
//     runs, the broker accepts and retention has not expired. A row is
//     marked sent only after the broker acknowledged it; a lost lease lets
//     another relay take over, and the fence rejects the old owner's writes.
//   - G3: the events of one aggregate are published and applied in
//     aggregate_seq order (allocated under a row lock in the producer's
//     transaction); no global order is claimed.
//   - G4: a consumer applies each event's effect once per (consumer, event
//     id) in its own database: the inbox claim, the effect and the cursor
//     commit together, and the broker is acked only after that commit.
//   - G5: external side effects (HTTP, payments, e-mail) are never retried
//     blind: the effect ledger keeps a stable idempotency key, records an
//     unknown outcome as unknown and reconciles it by a status query.
//
// Ferry never claims exactly-once delivery, global order across aggregates
// or shards, or atomicity across services. A component's "sent" is never
// evidence: the tables and the broker's receipts are (package ops,
// Evidence).
//
// # The packages
//
// Writing events:
//
//   - [github.com/ferryhq/ferry/outbox]: Insert / InsertTx in the caller's
//     transaction (G1, G3).
//   - [github.com/ferryhq/ferry/command]: idempotent commands whose outcome
//     and events commit together.
//   - [github.com/ferryhq/ferry/migrate]: the tables, for every dialect
//     (also as plain SQL for goose, atlas, golang-migrate).
//   - [github.com/ferryhq/ferry/driver]: the seam to a database library;
//     [github.com/ferryhq/ferry/driver/pgxv5] and
//     [github.com/ferryhq/ferry/driver/databasesql] (Postgres through pgx's
//     stdlib, SQLite through modernc.org/sqlite) sit behind it.
//
// Publishing:
//
//   - [github.com/ferryhq/ferry/relay]: the polling relay (G2, G3);
//     [github.com/ferryhq/ferry/relay/cdc] streams from Postgres logical
//     replication instead.
//   - [github.com/ferryhq/ferry/broker]: the Publisher / Consumer seam;
//     [github.com/ferryhq/ferry/broker/natsjs],
//     [github.com/ferryhq/ferry/broker/kafka] and
//     [github.com/ferryhq/ferry/broker/rabbitmq] implement it, with
//     [github.com/ferryhq/ferry/broker/cloudevents] as the wire format.
//
// Consuming:
//
//   - [github.com/ferryhq/ferry/inbox]: once-in-effect application, parking
//     and replay (G3, G4).
//   - [github.com/ferryhq/ferry/effect]: the effect ledger and worker (G5);
//     [github.com/ferryhq/ferry/effect/effecthttp] for HTTP providers.
//
// Operating and proving:
//
//   - [github.com/ferryhq/ferry/ops]: status, dead letters, parked
//     messages, replay, cleanup, evidence and the audit log — what the
//     ferry command, the console and the MCP server call;
//     [github.com/ferryhq/ferry/opsauth] says who may do what there.
//   - [github.com/ferryhq/ferry/deploy]: Prometheus alert rules and a
//     Grafana dashboard, tested with promtool.
//   - [github.com/ferryhq/ferry/otelferry]: trace context across the
//     pipeline (OpenTelemetry messaging conventions).
//   - [github.com/ferryhq/ferry/prove]: fault injection that shows, with
//     numbers, that nothing was lost or applied twice.
//   - [github.com/ferryhq/ferry/ferrytest]: helpers for the tests of code
//     built on Ferry.
//
// The ferry command (cmd/ferry) runs the relay and the operator tools;
// `go run ./cmd/ferry demo` shows the whole flow with nothing to install.
package ferry
