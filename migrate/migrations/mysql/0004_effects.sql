-- Request idempotency for commands (package command): one row per
-- (tenant, key), written in the command's own transaction together with its
-- business rows, so "the command ran" and "its outcome is stored" commit as one.
-- A concurrent caller with the same key blocks on the uncommitted row's unique
-- index entry and then reads the stored outcome.
CREATE TABLE {{.T "command_keys"}} (
    tenant_id   VARCHAR(255) NOT NULL,
    idem_key    VARCHAR(255) NOT NULL,
    fingerprint VARBINARY(64) NOT NULL,
    result      LONGBLOB     NOT NULL DEFAULT (''),
    event_ids   TEXT         NOT NULL DEFAULT (''),
    created_at  DATETIME(6)  NOT NULL,
    expires_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Cleanup deletes expired keys in small batches.
CREATE INDEX {{.I "command_keys_expires_idx"}} ON {{.T "command_keys"}} (expires_at);

-- The effect ledger (package effect): a downstream outbox for calls to outside
-- systems. A consumer handler records an intent in its own transaction; the
-- effect worker executes it with idem_key and records the outcome.
-- States: pending -> in_flight -> succeeded | failed | unknown; unknown is
-- resolved by a status query (reconciliation), never by a blind retry.
CREATE TABLE {{.T "effects"}} (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    idem_key         VARCHAR(255) NOT NULL,
    consumer         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_id         CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    step             VARCHAR(255) NOT NULL,
    tenant_id        VARCHAR(255) NOT NULL DEFAULT '',
    target           VARCHAR(255) NOT NULL,
    operation        VARCHAR(255) NOT NULL,
    request          LONGBLOB     NOT NULL,
    request_sha      VARBINARY(64) NOT NULL,
    state            VARCHAR(16)  NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'in_flight', 'succeeded', 'failed', 'unknown')),
    attempts         INT          NOT NULL DEFAULT 0,
    reconciliations  INT          NOT NULL DEFAULT 0,
    next_attempt_at  DATETIME(6)  NOT NULL,
    lease_owner      VARCHAR(255) NOT NULL DEFAULT '',
    lease_until      DATETIME(6)  NULL,
    operation_id     TEXT         NOT NULL DEFAULT (''),
    response_summary TEXT         NOT NULL DEFAULT (''),
    last_error       TEXT         NOT NULL DEFAULT (''),
    created_at       DATETIME(6)  NOT NULL,
    updated_at       DATETIME(6)  NOT NULL,
    unknown_since    DATETIME(6)  NULL,
    completed_at     DATETIME(6)  NULL,
    CONSTRAINT {{.I "effects_key"}} UNIQUE (idem_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- The worker's claim: open rows, due first.
CREATE INDEX {{.I "effects_due_idx"}} ON {{.T "effects"}} (state, next_attempt_at, id);
-- Evidence: every ledger row links back to the event that caused it.
CREATE INDEX {{.I "effects_event_idx"}} ON {{.T "effects"}} (event_id, consumer);
