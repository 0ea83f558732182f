-- The outbox: one row per event, written in the producer's transaction.
-- Column names map onto Debezium's Outbox Event Router (docs/DEBEZIUM.md).
--
-- Partitioned (migrate.WithPartitionedOutbox, docs/PARTITIONING.md): range
-- partitions of created_at, created ahead by migrate, the relay and
-- cleanup. Postgres requires every unique constraint of a partitioned
-- table to include the partition key, so there the primary key, the
-- event id and the aggregate sequence are unique per created_at: ids come
-- from the identity and event ids are UUIDv7s (unique in practice); the
-- aggregate sequence stays unique because the producer allocates it under
-- the aggregate_seq row lock below, which this constraint only backs up.
CREATE TABLE {{.T "outbox"}} (
    id              bigint GENERATED ALWAYS AS IDENTITY{{if not .Partitioned}} PRIMARY KEY{{end}},
    event_id        uuid        NOT NULL,
    tenant_id       text        NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    aggregate_seq   bigint      NOT NULL CHECK (aggregate_seq >= 1),
    event_type      text        NOT NULL,
    schema_version  integer     NOT NULL CHECK (schema_version >= 1),
    topic           text        NOT NULL,
    shard           integer     NOT NULL CHECK (shard >= 0),
    shard_count     integer     NOT NULL CHECK (shard_count >= 1),
    content_type    text        NOT NULL,
    payload         bytea       NOT NULL,
    occurred_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    traceparent     text        NOT NULL DEFAULT '',
    correlation_id  text        NOT NULL DEFAULT '',
    causation_id    text        NOT NULL DEFAULT '',
    principal       text        NOT NULL DEFAULT '',
    action          text        NOT NULL DEFAULT '',
    target          text        NOT NULL DEFAULT '',
    -- relay state (DESIGN §4/§5)
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text        NOT NULL DEFAULT '',
    published_at    timestamptz,
    broker_receipt  text        NOT NULL DEFAULT '',
{{- if .Partitioned}}
    CONSTRAINT {{.I "outbox_pkey"}} PRIMARY KEY (id, created_at),
    CONSTRAINT {{.I "outbox_event_id_key"}} UNIQUE (event_id, created_at),
    CONSTRAINT {{.I "outbox_aggregate_seq_key"}} UNIQUE (tenant_id, aggregate_type, aggregate_id, aggregate_seq, created_at)
) PARTITION BY RANGE (created_at);
{{- else}}
    CONSTRAINT {{.I "outbox_event_id_key"}} UNIQUE (event_id),
    CONSTRAINT {{.I "outbox_aggregate_seq_key"}} UNIQUE (tenant_id, aggregate_type, aggregate_id, aggregate_seq)
);
{{- end}}

-- The relay's claim: pending rows of a shard, due now, oldest first.
CREATE INDEX {{.I "outbox_pending_idx"}} ON {{.T "outbox"}} (shard, next_attempt_at, id) WHERE status = 'pending';
-- Head-of-line check: is there an earlier unsent row of this aggregate?
CREATE INDEX {{.I "outbox_unsent_aggregate_idx"}} ON {{.T "outbox"}} (tenant_id, aggregate_type, aggregate_id, aggregate_seq) WHERE status <> 'sent';
-- Cleanup of sent rows in small batches; evidence by correlation id.
CREATE INDEX {{.I "outbox_sent_idx"}} ON {{.T "outbox"}} (published_at) WHERE status = 'sent';
CREATE INDEX {{.I "outbox_correlation_idx"}} ON {{.T "outbox"}} (correlation_id) WHERE correlation_id <> '';

-- Per-aggregate sequence. The producer's upsert locks this row until commit,
-- which serialises writers of one aggregate: commit order = sequence order.
CREATE TABLE {{.T "aggregate_seq"}} (
    tenant_id      text   NOT NULL,
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (tenant_id, aggregate_type, aggregate_id)
);
