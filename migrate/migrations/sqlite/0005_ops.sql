-- Operations (package ops): audit trail, replay window settings, DLQ
-- columns. See the Postgres file for the reasoning. SQLite cannot alter a
-- CHECK constraint, so a discarded dead letter is marked by discarded_at.
CREATE TABLE {{.T "ops_audit"}} (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    actor     TEXT      NOT NULL CHECK (actor <> ''),
    action    TEXT      NOT NULL CHECK (action <> ''),
    filter    TEXT      NOT NULL DEFAULT '{}',
    row_count INTEGER   NOT NULL CHECK (row_count >= 0),
    reason    TEXT      NOT NULL CHECK (reason <> ''),
    ids       TEXT      NOT NULL DEFAULT '[]'
);
CREATE INDEX {{.I "ops_audit_at_idx"}} ON {{.Bare "ops_audit"}} (at);

CREATE TABLE {{.T "ops_settings"}} (
    name          TEXT      PRIMARY KEY,
    value_seconds INTEGER   NOT NULL CHECK (value_seconds >= 0),
    updated_at    TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now'))
);
INSERT INTO {{.T "ops_settings"}} (name, value_seconds) VALUES
    ('broker_dedup_window', 120),
    ('inbox_replay_horizon', 604800);

ALTER TABLE {{.T "outbox"}} ADD COLUMN discarded_at TIMESTAMP;
ALTER TABLE {{.T "outbox"}} ADD COLUMN discard_audit_id INTEGER;
CREATE INDEX {{.I "outbox_dead_idx"}} ON {{.Bare "outbox"}} (created_at, id) WHERE status = 'dead';

-- Replay requests for parked messages (see the Postgres file).
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_requested_at TIMESTAMP;
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_request TEXT NOT NULL DEFAULT '' CHECK (replay_request IN ('', 'replay', 'release_gap'));
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_audit_id INTEGER;
CREATE INDEX {{.I "inbox_parked_replay_idx"}} ON {{.Bare "inbox_parked"}} (consumer, id) WHERE replay_requested_at IS NOT NULL;
