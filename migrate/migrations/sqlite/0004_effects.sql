-- Request idempotency for commands (package command). See the Postgres
-- migration for the reasoning; SQLite serialises writers with its write lock.
CREATE TABLE {{.T "command_keys"}} (
    tenant_id   TEXT      NOT NULL,
    idem_key    TEXT      NOT NULL,
    fingerprint BLOB      NOT NULL,
    result      BLOB      NOT NULL DEFAULT x'',
    event_ids   TEXT      NOT NULL DEFAULT '',
    created_at  TIMESTAMP NOT NULL,
    expires_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX {{.I "command_keys_expires_idx"}} ON {{.Bare "command_keys"}} (expires_at);

-- The effect ledger (package effect).
CREATE TABLE {{.T "effects"}} (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    idem_key         TEXT      NOT NULL,
    consumer         TEXT      NOT NULL,
    event_id         TEXT      NOT NULL,
    step             TEXT      NOT NULL,
    tenant_id        TEXT      NOT NULL DEFAULT '',
    target           TEXT      NOT NULL,
    operation        TEXT      NOT NULL,
    request          BLOB      NOT NULL,
    request_sha      BLOB      NOT NULL,
    state            TEXT      NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'in_flight', 'succeeded', 'failed', 'unknown')),
    attempts         INTEGER   NOT NULL DEFAULT 0,
    reconciliations  INTEGER   NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMP NOT NULL,
    lease_owner      TEXT      NOT NULL DEFAULT '',
    lease_until      TIMESTAMP,
    operation_id     TEXT      NOT NULL DEFAULT '',
    response_summary TEXT      NOT NULL DEFAULT '',
    last_error       TEXT      NOT NULL DEFAULT '',
    created_at       TIMESTAMP NOT NULL,
    updated_at       TIMESTAMP NOT NULL,
    unknown_since    TIMESTAMP,
    completed_at     TIMESTAMP,
    CONSTRAINT {{.I "effects_key"}} UNIQUE (idem_key)
);
CREATE INDEX {{.I "effects_due_idx"}} ON {{.Bare "effects"}} (next_attempt_at, id) WHERE state IN ('pending', 'unknown', 'in_flight');
CREATE INDEX {{.I "effects_event_idx"}} ON {{.Bare "effects"}} (event_id, consumer);
