-- The outbox: one row per event, written in the producer's transaction.
CREATE TABLE {{.T "outbox"}} (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT      NOT NULL,
    tenant_id       TEXT      NOT NULL,
    aggregate_type  TEXT      NOT NULL,
    aggregate_id    TEXT      NOT NULL,
    aggregate_seq   INTEGER   NOT NULL CHECK (aggregate_seq >= 1),
    event_type      TEXT      NOT NULL,
    schema_version  INTEGER   NOT NULL CHECK (schema_version >= 1),
    topic           TEXT      NOT NULL,
    shard           INTEGER   NOT NULL CHECK (shard >= 0),
    shard_count     INTEGER   NOT NULL CHECK (shard_count >= 1),
    content_type    TEXT      NOT NULL,
    payload         BLOB      NOT NULL,
    occurred_at     TIMESTAMP NOT NULL,
    created_at      TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    traceparent     TEXT      NOT NULL DEFAULT '',
    correlation_id  TEXT      NOT NULL DEFAULT '',
    causation_id    TEXT      NOT NULL DEFAULT '',
    principal       TEXT      NOT NULL DEFAULT '',
    action          TEXT      NOT NULL DEFAULT '',
    target          TEXT      NOT NULL DEFAULT '',
    status          TEXT      NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        INTEGER   NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    last_error      TEXT      NOT NULL DEFAULT '',
    published_at    TIMESTAMP,
    broker_receipt  TEXT      NOT NULL DEFAULT '',
    CONSTRAINT {{.I "outbox_event_id_key"}} UNIQUE (event_id),
    CONSTRAINT {{.I "outbox_aggregate_seq_key"}} UNIQUE (tenant_id, aggregate_type, aggregate_id, aggregate_seq)
);
CREATE INDEX {{.I "outbox_pending_idx"}} ON {{.Bare "outbox"}} (shard, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX {{.I "outbox_unsent_aggregate_idx"}} ON {{.Bare "outbox"}} (tenant_id, aggregate_type, aggregate_id, aggregate_seq) WHERE status <> 'sent';
CREATE INDEX {{.I "outbox_sent_idx"}} ON {{.Bare "outbox"}} (published_at) WHERE status = 'sent';
CREATE INDEX {{.I "outbox_correlation_idx"}} ON {{.Bare "outbox"}} (correlation_id) WHERE correlation_id <> '';

CREATE TABLE {{.T "aggregate_seq"}} (
    tenant_id      TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    last_seq       INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, aggregate_type, aggregate_id)
);
