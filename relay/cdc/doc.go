// Package cdc is Ferry's log-based relay: it publishes committed outbox
// rows by reading Postgres' write-ahead log through logical replication
// (the built-in pgoutput plugin), instead of polling the outbox table.
//
// Polling costs a query per cycle and adds up to a poll interval of
// latency; the log already holds every committed insert, in commit order,
// and a replication slot remembers how far a consumer got. The relay turns
// that into the same guarantees as the polling relay (DESIGN G2, G3)
// without Kafka Connect to operate. Long-form operations guide:
// docs/CDC.md; the Debezium mapping: docs/DEBEZIUM.md.
//
// # Usage
//
//	pub, _ := natsjs.DialPublisher(natsURL)
//	r, err := cdc.New("postgres://app@db/app", pub,
//		cdc.WithSlotName("ferry_cdc"), cdc.WithRegisterer(prometheus.DefaultRegisterer))
//	if err != nil { ... }              // *ferry.ConfigError naming the field
//	err = r.Run(ctx)                   // until ctx ends; nil on shutdown
//	st := r.Status()                   // role, confirmed LSN, slot lag
//
// [Inspect] reads the slot's state from the database, for tools running
// in another process than the relay (`ferry status`).
//
// The connection string is an ordinary Postgres URL; the relay opens its
// streaming connection with replication=database itself. The role needs
// the REPLICATION attribute (or to own the slot), CREATE on the database
// for the first CREATE PUBLICATION (or a DBA creates it, see docs/CDC.md),
// and UPDATE on the outbox table. The server needs wal_level=logical.
// Migrations must be applied (`ferry migrate up`, 0006 adds the small
// bookkeeping table ferry_cdc_slot).
//
// # What is published
//
// On first start Run creates a publication for the outbox table only,
// inserts only (`CREATE PUBLICATION … FOR TABLE outbox WITH (publish =
// 'insert')`), and a persistent logical slot. Business tables, updates and
// deletes of outbox rows (the relay's own status writes), rolled-back
// transactions, and logical messages (heartbeats; the stream is started
// with messages=false) never reach the broker. On a partitioned outbox
// (migrate.WithPartitionedOutbox) the publication also publishes via the
// partition root, so rows of every partition, created later ones too,
// arrive as outbox rows; the relay keeps partitions created ahead
// ([WithPartitionMaintenance]) and marks each row in its own partition
// (docs/PARTITIONING.md). Each replicated row is
// decoded from pgoutput's text form into a [ferry.Event] and published
// through a [broker.Publisher], the same interface and CloudEvents mapping
// the polling relay uses, so consumers cannot tell the two apart.
//
// # When Postgres forgets: the confirmed LSN
//
// Transactions are buffered until their Commit message and handed to the
// publisher in commit order; several transactions queued behind an
// in-flight batch are published together. A transaction's end LSN is
// confirmed to Postgres (the standby status update's flush position) only
// after every event of it, and of every earlier transaction, was
// acknowledged by the broker and recorded in the outbox table (status
// 'sent' with published_at and the broker receipt, or 'dead'). Every
// restart resumes from the slot (START_REPLICATION with position 0, i.e.
// the slot's confirmed_flush_lsn), never from the current WAL position, so
// a restart re-publishes at most the unconfirmed tail, with the same event
// ids, and never skips a row. Broker dedup (JetStream's Nats-Msg-Id window)
// and the inbox absorb those duplicates.
//
// Why the status write comes before the confirmation: losses are ruled out
// by writing 'sent' only after the broker ack (slot-loss recovery
// re-publishes every row still 'pending', so a row the table calls pending
// is never lost, only possibly duplicated). Ordering the status write
// before the confirmation adds that the table is accurate for every row the
// slot has forgotten: `ferry evidence` never shows a published event as
// pending once Postgres may have dropped its WAL, and a slot-loss recovery
// re-publishes only what was really unconfirmed. The price is that the
// slot trails by one flush interval. Status writes happen in a background
// flusher (one UPDATE per flush interval, default 20ms, for every event
// acknowledged meanwhile), off the publish path: commit→ack latency does
// not include them.
//
// # Table and broker agree
//
// Postgres may decode a transaction before its rows are visible to other
// sessions (the commit record is flushed before the backend leaves the proc
// array). The marking statement therefore also returns the ids its snapshot
// did not contain; the flusher waits for them (at most 2s) before it
// confirms. A reconciler ([WithReconcileInterval], default 10s) notes the
// oldest pending rows and the WAL insert position W after that snapshot;
// once the relay has confirmed a position >= W, a noted row still pending
// will never come through the slot again, so it is re-published (broker
// dedup answers with the original receipt) and marked. Rows ahead of the
// slot are never touched. See docs/CDC.md, "Table and broker agree".
//
// # Failures
//
// A transient broker error (class NotSent or Indeterminate) is retried, in
// order, with bounded exponential backoff and full jitter, and the broker
// is probed with Ping before each new attempt, so an outage costs one probe
// per backoff period, never a retry storm. Meanwhile nothing is confirmed;
// the relay stops reading (back-pressure) but keeps answering the server so
// the session is not timed out. A permanent error (too large, no route)
// marks that row dead with a sanitised last_error, increments
// ferry_cdc_dead_total and logs an alert; the relay continues. CDC mode has
// no "hold the aggregate" policy: the stream cannot be re-ordered around a
// held row, and holding would pin the slot (and WAL) for as long as the
// dead row waits. Replay dead rows with the operator tools.
//
// # One consumer per slot
//
// Postgres refuses a second START_REPLICATION on an active slot. A second
// relay on the same slot therefore runs as standby ([RoleStandby]),
// retrying every acquire interval, and takes over when the first dies (its
// connection closes and the slot becomes inactive).
//
// # Slot lag, heartbeat and slot loss
//
// A slot keeps WAL until its consumer confirms it. When no outbox
// transaction is open or unconfirmed, the relay confirms the WAL position
// carried by the server's keepalives (it asks for one every standby
// interval): everything before it has been sent and was not an outbox
// insert, so an idle outbox on a busy database does not pin WAL.
// [WithHeartbeat] optionally writes a logical message periodically so the
// position moves even with no other traffic. Lag is sampled from
// pg_replication_slots into [Status] and ferry_cdc_slot_lag_seconds (the
// WAL bytes a slot retains are exported once, by ops.Collector, as
// ferry_ops_cdc_slot_lag_bytes); crossing [WithLagAlert] logs an alert. Set max_slot_wal_keep_size so a stuck relay cannot fill the disk:
// Postgres then invalidates the slot (wal_status = lost) instead.
//
// A lost slot (invalidated, or dropped while no relay ran) is detected at
// the next start: the relay logs an alert, increments
// ferry_cdc_slot_lost_total, recreates the slot and re-publishes every
// 'pending' row from the table in id order (per aggregate, that is sequence
// order) before streaming. The ferry_cdc_slot table tells a lost slot from
// a first start and carries the durable catch-up marker, cleared only after
// the catch-up was recorded. The catch-up is bounded by the new slot's
// exported snapshot, so rows committed after the slot's consistent point
// come through the slot, not twice. The same catch-up publishes rows
// written before the very first slot existed (e.g. when switching from the
// polling relay).
//
// # Faults
//
// [WithFaults] removes individual safety mechanisms (confirm before ack,
// start from the current WAL position, no catch-up, no idle advance) so the
// tests and `ferry prove` can show that each one is needed. Never set it
// in production.
package cdc
