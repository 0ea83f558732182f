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

-- Replay requests for parked messages. `ferry parked replay|release-gap`
-- runs in an operator's shell, which has neither the consumer's handler nor
-- its authorization code, so it does not replay: it marks the rows, and the
-- consumer process (ops.ServeReplayRequests around its inbox) replays them
-- through inbox.Replay / inbox.ReleaseGap, i.e. through the consumer's
-- current schema, authorization, dedup and cursor checks. The audit id links
-- the request to the operator's audit row.
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_requested_at timestamptz;
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_request text NOT NULL DEFAULT '' CHECK (replay_request IN ('', 'replay', 'release_gap'));
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_audit_id bigint;
CREATE INDEX {{.I "inbox_parked_replay_idx"}} ON {{.T "inbox_parked"}} (consumer, id) WHERE replay_requested_at IS NOT NULL;
