-- The outbox (MySQL 8 / MariaDB 10.6+): one row per event, written in the
-- producer's transaction. Same tables and columns as the Postgres dialect;
-- the differences (docs/MYSQL.md): timestamps are DATETIME(6) holding UTC
-- (driver/mysql sets time_zone '+00:00'); uuids are CHAR(36); text that is
-- part of a key is VARCHAR (InnoDB's 3072-byte key limit), and tenant,
-- aggregate type, event type, topic and consumer names — ASCII tokens by
-- validation — are ASCII columns; binary collations, so comparisons are
-- case- and accent-sensitive as on Postgres; no partial indexes, so each
-- index leads with the column the Postgres index filtered on.
CREATE TABLE {{.T "outbox"}} (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id        CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant_id       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_type  VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_id    VARCHAR(255) NOT NULL,
    aggregate_seq   BIGINT       NOT NULL CHECK (aggregate_seq >= 1),
    event_type      VARCHAR(255) NOT NULL,
    schema_version  INT          NOT NULL CHECK (schema_version >= 1),
    topic           VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    shard           INT          NOT NULL CHECK (shard >= 0),
    shard_count     INT          NOT NULL CHECK (shard_count >= 1),
    content_type    VARCHAR(255) NOT NULL,
    payload         LONGBLOB     NOT NULL,
    occurred_at     DATETIME(6)  NOT NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    traceparent     VARCHAR(255) NOT NULL DEFAULT '',
    correlation_id  VARCHAR(1024) NOT NULL DEFAULT '',
    causation_id    VARCHAR(1024) NOT NULL DEFAULT '',
    principal       VARCHAR(1024) NOT NULL DEFAULT '',
    action          VARCHAR(1024) NOT NULL DEFAULT '',
    target          VARCHAR(1024) NOT NULL DEFAULT '',
    -- relay state (DESIGN §4/§5)
    status          VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_error      TEXT         NOT NULL DEFAULT (''),
    published_at    DATETIME(6)  NULL,
    broker_receipt  TEXT         NOT NULL DEFAULT (''),
    CONSTRAINT {{.I "outbox_event_id_key"}} UNIQUE (event_id),
    CONSTRAINT {{.I "outbox_aggregate_seq_key"}} UNIQUE (tenant_id, aggregate_type, aggregate_id, aggregate_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The relay's claim: pending rows of a shard, due now, oldest first.
CREATE INDEX {{.I "outbox_pending_idx"}} ON {{.T "outbox"}} (status, shard, next_attempt_at, id);
-- Head-of-line check: is there an earlier unsent row of this aggregate?
CREATE INDEX {{.I "outbox_unsent_aggregate_idx"}} ON {{.T "outbox"}} (tenant_id, aggregate_type, aggregate_id, aggregate_seq, status);
-- Cleanup of sent rows in small batches; evidence by correlation id.
CREATE INDEX {{.I "outbox_sent_idx"}} ON {{.T "outbox"}} (status, published_at);
CREATE INDEX {{.I "outbox_correlation_idx"}} ON {{.T "outbox"}} (correlation_id(255));

-- Per-aggregate sequence. The producer's upsert locks this row until commit,
-- which serialises writers of one aggregate: commit order = sequence order.
CREATE TABLE {{.T "aggregate_seq"}} (
    tenant_id      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_type VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    last_seq       BIGINT       NOT NULL,
    PRIMARY KEY (tenant_id, aggregate_type, aggregate_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
