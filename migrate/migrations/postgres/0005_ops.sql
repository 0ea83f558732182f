-- Operations (package ops, issue 7): the audit trail of operator actions,
-- the replay/redelivery window that guards cleanup, and the outbox columns
-- the DLQ tools need. 0001 is not edited: discarding a dead letter sets
-- discarded_at instead of adding a status value, so the status CHECK stays
-- as it is on both dialects and a discarded row keeps status 'dead' as
-- evidence of what happened.
CREATE TABLE {{.T "ops_audit"}} (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL CHECK (actor <> ''),
    action    text        NOT NULL CHECK (action <> ''),
    filter    text        NOT NULL DEFAULT '{}',
    row_count bigint      NOT NULL CHECK (row_count >= 0),
    reason    text        NOT NULL CHECK (reason <> ''),
    ids       text        NOT NULL DEFAULT '[]'
);
CREATE INDEX {{.I "ops_audit_at_idx"}} ON {{.T "ops_audit"}} (at);

-- Named durations in seconds. broker_dedup_window is the broker's
-- redelivery/dedup window (JetStream's default is 2 minutes);
-- inbox_replay_horizon is how far back events may still be redelivered or
-- replayed to consumers. Cleanup refuses any retention shorter than either.
CREATE TABLE {{.T "ops_settings"}} (
    name          text        PRIMARY KEY,
    value_seconds bigint      NOT NULL CHECK (value_seconds >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{.T "ops_settings"}} (name, value_seconds) VALUES
    ('broker_dedup_window', 120),
    ('inbox_replay_horizon', 604800);

-- A discarded dead letter: kept for evidence, excluded from the DLQ and
-- from the dead-letter gauge; the audit row says who and why.
ALTER TABLE {{.T "outbox"}} ADD COLUMN discarded_at timestamptz;
ALTER TABLE {{.T "outbox"}} ADD COLUMN discard_audit_id bigint;
-- DLQ listing and dead-letter cleanup by age.
CREATE INDEX {{.I "outbox_dead_idx"}} ON {{.T "outbox"}} (created_at, id) WHERE status = 'dead';
