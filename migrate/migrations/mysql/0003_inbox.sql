-- The inbox (issue 4): what a consumer has applied, where each aggregate's
-- cursor stands, and the messages it parked instead of dropping. All three
-- are written in the consumer's own transaction, together with its effect.

-- One row per applied event: the dedup claim. The key carries the tenant so
-- one tenant can never suppress another's events by reusing an id; the
-- fingerprint (SHA-256 of the canonical envelope + payload) tells a true
-- duplicate from a collision (same id, different content).
CREATE TABLE {{.T "inbox"}} (
    consumer       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant_id      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_id       CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint    VARBINARY(64) NOT NULL,
    aggregate_type VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    aggregate_seq  BIGINT       NOT NULL,
    event_type     VARCHAR(255) NOT NULL,
    applied_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, tenant_id, event_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Cleanup by age (never shorter than the replay window).
CREATE INDEX {{.I "inbox_applied_idx"}} ON {{.T "inbox"}} (consumer, applied_at);

-- Per-aggregate cursor: the last sequence this consumer applied. Locked
-- (FOR UPDATE) by the claim, so two instances cannot apply one aggregate
-- out of order.
CREATE TABLE {{.T "inbox_cursor"}} (
    consumer       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant_id      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_type VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    last_seq       BIGINT       NOT NULL CHECK (last_seq >= 0),
    updated_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Parked messages: gap, schema, unauthorized, poison, collision,
-- undecodable. A row stays open (resolved_at IS NULL) until a replay,
-- a gap fill or an operator resolves it; resolved rows are kept as evidence.
-- Envelope columns are utf8mb4 here (an undecodable or invalid message may
-- carry anything).
CREATE TABLE {{.T "inbox_parked"}} (
    id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    reason            VARCHAR(16)  NOT NULL CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable')),
    -- tenant/event_id/fingerprint, or raw:<sha256> for undecodable messages:
    -- one open row per distinct message, however often it is redelivered.
    park_key          VARCHAR(512) NOT NULL,
    -- park_key while the row is open, NULL once resolved: MySQL has no
    -- partial unique index, and a unique index admits many NULLs, so
    -- UNIQUE (consumer, open_park_key) is Postgres's
    -- UNIQUE (consumer, park_key) WHERE resolved_at IS NULL.
    open_park_key     VARCHAR(512) GENERATED ALWAYS AS (CASE WHEN resolved_at IS NULL THEN park_key END) STORED,
    attempts          INT          NOT NULL DEFAULT 1,
    first_seen        DATETIME(6)  NOT NULL,
    last_seen         DATETIME(6)  NOT NULL,
    last_error        TEXT         NOT NULL DEFAULT (''),
    resolved_at       DATETIME(6)  NULL,
    resolution        TEXT         NOT NULL DEFAULT (''),
    -- the envelope and payload, enough to replay through the live path
    tenant_id         VARCHAR(255) NOT NULL DEFAULT '',
    event_id          CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NULL,
    aggregate_type    VARCHAR(255) NOT NULL DEFAULT '',
    aggregate_id      VARCHAR(255) NOT NULL DEFAULT '',
    aggregate_seq     BIGINT       NOT NULL DEFAULT 0,
    event_type        VARCHAR(255) NOT NULL DEFAULT '',
    schema_version    INT          NOT NULL DEFAULT 0,
    content_type      VARCHAR(255) NOT NULL DEFAULT '',
    payload           LONGBLOB     NOT NULL DEFAULT (''),
    occurred_at       DATETIME(6)  NULL,
    topic             VARCHAR(255) NOT NULL DEFAULT '',
    traceparent       VARCHAR(255) NOT NULL DEFAULT '',
    correlation_id    TEXT         NOT NULL DEFAULT (''),
    causation_id      TEXT         NOT NULL DEFAULT (''),
    principal         TEXT         NOT NULL DEFAULT (''),
    action            TEXT         NOT NULL DEFAULT (''),
    target            TEXT         NOT NULL DEFAULT (''),
    fingerprint       VARBINARY(64) NOT NULL DEFAULT '',
    -- collision: the fingerprint of the event already applied under this key
    other_fingerprint VARBINARY(64) NOT NULL DEFAULT '',
    -- undecodable: the message as received (bounded)
    raw_destination   TEXT         NOT NULL DEFAULT (''),
    raw_key           TEXT         NOT NULL DEFAULT (''),
    raw_headers       TEXT         NOT NULL DEFAULT (''),
    raw_body          LONGBLOB     NOT NULL DEFAULT (''),
    CONSTRAINT {{.I "inbox_parked_open_key"}} UNIQUE (consumer, open_park_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Gap successors of an aggregate, in order (prefixes of the utf8mb4 columns
-- keep the key under 3072 bytes; equality lookups recheck the row).
CREATE INDEX {{.I "inbox_parked_gap_idx"}} ON {{.T "inbox_parked"}} (consumer, tenant_id(100), aggregate_type(100), aggregate_id, aggregate_seq);
-- Listing and metrics: open rows by reason and age.
CREATE INDEX {{.I "inbox_parked_open_idx"}} ON {{.T "inbox_parked"}} (consumer, reason, first_seen);
