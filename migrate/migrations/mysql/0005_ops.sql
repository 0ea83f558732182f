-- Operations (package ops, issue 7): the audit trail of operator actions,
-- the replay/redelivery window that guards cleanup, and the outbox columns
-- the DLQ tools need. Discarding a dead letter sets discarded_at instead of
-- adding a status value; a discarded row keeps status 'dead' as evidence.
CREATE TABLE {{.T "ops_audit"}} (
    id        BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at        DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    actor     VARCHAR(255) NOT NULL CHECK (actor <> ''),
    action    VARCHAR(255) NOT NULL CHECK (action <> ''),
    filter    LONGTEXT     NOT NULL DEFAULT ('{}'),
    row_count BIGINT       NOT NULL CHECK (row_count >= 0),
    reason    TEXT         NOT NULL CHECK (reason <> ''),
    ids       LONGTEXT     NOT NULL DEFAULT ('[]')
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX {{.I "ops_audit_at_idx"}} ON {{.T "ops_audit"}} (at);

-- Named durations in seconds. broker_dedup_window is the broker's
-- redelivery/dedup window (JetStream's default is 2 minutes);
-- inbox_replay_horizon is how far back events may still be redelivered or
-- replayed to consumers. Cleanup refuses any retention shorter than either.
CREATE TABLE {{.T "ops_settings"}} (
    name          VARCHAR(128) NOT NULL PRIMARY KEY,
    value_seconds BIGINT       NOT NULL CHECK (value_seconds >= 0),
    updated_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT INTO {{.T "ops_settings"}} (name, value_seconds) VALUES
    ('broker_dedup_window', 120),
    ('inbox_replay_horizon', 604800)
    ON DUPLICATE KEY UPDATE name = name;

-- A discarded dead letter: kept for evidence, excluded from the DLQ and
-- from the dead-letter gauge; the audit row says who and why.
ALTER TABLE {{.T "outbox"}} ADD COLUMN discarded_at DATETIME(6) NULL;
ALTER TABLE {{.T "outbox"}} ADD COLUMN discard_audit_id BIGINT NULL;
-- DLQ listing and dead-letter cleanup by age.
CREATE INDEX {{.I "outbox_dead_idx"}} ON {{.T "outbox"}} (status, created_at, id);

-- Replay requests for parked messages. `ferry parked replay|release-gap`
-- marks the rows; the consumer process (ops.ServeReplayRequests around its
-- inbox) replays them through its current schema, authorization, dedup and
-- cursor checks. The audit id links the request to the operator's audit row.
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_requested_at DATETIME(6) NULL;
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_request VARCHAR(16) NOT NULL DEFAULT '' CHECK (replay_request IN ('', 'replay', 'release_gap'));
ALTER TABLE {{.T "inbox_parked"}} ADD COLUMN replay_audit_id BIGINT NULL;
CREATE INDEX {{.I "inbox_parked_replay_idx"}} ON {{.T "inbox_parked"}} (consumer, replay_requested_at, id);
