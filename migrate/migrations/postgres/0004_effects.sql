-- Request idempotency for commands (package command): one row per
-- (tenant, key), written in the command's own transaction together with its
-- business rows, so "the command ran" and "its outcome is stored" commit as one.
-- A concurrent caller with the same key blocks on the uncommitted row's unique
-- index entry and then reads the stored outcome.
CREATE TABLE {{.T "command_keys"}} (
    tenant_id   text        NOT NULL,
    idem_key    text        NOT NULL,
    fingerprint bytea       NOT NULL,
    result      bytea       NOT NULL DEFAULT '\x'::bytea,
    event_ids   text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);
-- Cleanup deletes expired keys in small batches.
CREATE INDEX {{.I "command_keys_expires_idx"}} ON {{.T "command_keys"}} (expires_at);

-- The effect ledger (package effect): a downstream outbox for calls to outside
-- systems. A consumer handler records an intent in its own transaction; the
-- effect worker executes it with idem_key and records the outcome.
-- States: pending -> in_flight -> succeeded | failed | unknown; unknown is
-- resolved by a status query (reconciliation), never by a blind retry.
CREATE TABLE {{.T "effects"}} (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idem_key         text        NOT NULL,
    consumer         text        NOT NULL,
    event_id         uuid        NOT NULL,
    step             text        NOT NULL,
    tenant_id        text        NOT NULL DEFAULT '',
    target           text        NOT NULL,
    operation        text        NOT NULL,
    request          bytea       NOT NULL,
    request_sha      bytea       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'in_flight', 'succeeded', 'failed', 'unknown')),
    attempts         integer     NOT NULL DEFAULT 0,
    reconciliations  integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      text        NOT NULL DEFAULT '',
    lease_until      timestamptz,
    operation_id     text        NOT NULL DEFAULT '',
    response_summary text        NOT NULL DEFAULT '',
    last_error       text        NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    unknown_since    timestamptz,
    completed_at     timestamptz,
    CONSTRAINT {{.I "effects_key"}} UNIQUE (idem_key)
);
-- The worker's claim: open rows, due first.
CREATE INDEX {{.I "effects_due_idx"}} ON {{.T "effects"}} (next_attempt_at, id) WHERE state IN ('pending', 'unknown', 'in_flight');
-- Evidence: every ledger row links back to the event that caused it.
CREATE INDEX {{.I "effects_event_idx"}} ON {{.T "effects"}} (event_id, consumer);
