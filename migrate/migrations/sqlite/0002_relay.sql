-- Relay shard leases: see the Postgres migration for the reasoning.
CREATE TABLE {{.T "relay_leases"}} (
    shard      INTEGER   PRIMARY KEY CHECK (shard >= 0),
    owner      TEXT      NOT NULL DEFAULT '',
    fence      INTEGER   NOT NULL DEFAULT 0,
    expires_at TIMESTAMP NOT NULL DEFAULT '1970-01-01 00:00:00.000+00:00'
);
CREATE TABLE {{.T "relay_instances"}} (
    instance_id  TEXT      PRIMARY KEY,
    shard_count  INTEGER   NOT NULL CHECK (shard_count >= 1),
    started_at   TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    heartbeat_at TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    expires_at   TIMESTAMP NOT NULL,
    -- circuit breaker state as of the last heartbeat, for `ferry status`
    breaker      TEXT      NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open'))
);
CREATE INDEX {{.I "outbox_claim_idx"}} ON {{.Bare "outbox"}} (shard, id) WHERE status = 'pending';
CREATE INDEX {{.I "outbox_dead_shard_idx"}} ON {{.Bare "outbox"}} (shard) WHERE status = 'dead';
