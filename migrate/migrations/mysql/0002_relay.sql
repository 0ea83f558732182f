-- Relay shard leases (DESIGN §5): one row per shard. A relay owns a shard
-- while expires_at (database clock, UTC) is in the future and owner is its
-- instance id. fence only ever increases: every acquisition bumps it, and
-- every state change a relay writes to the outbox is conditional on the
-- (owner, fence) it claimed with, so a relay that lost its lease cannot
-- overwrite the new owner's work.
CREATE TABLE {{.T "relay_leases"}} (
    shard      INT          NOT NULL PRIMARY KEY CHECK (shard >= 0),
    owner      VARCHAR(255) NOT NULL DEFAULT '',
    fence      BIGINT       NOT NULL DEFAULT 0,
    expires_at DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00'
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Live relay instances (heartbeats), for rebalancing: with N live
-- instances each takes about ceil(shards / N) leases.
CREATE TABLE {{.T "relay_instances"}} (
    instance_id  VARCHAR(255) NOT NULL PRIMARY KEY,
    shard_count  INT          NOT NULL CHECK (shard_count >= 1),
    started_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    heartbeat_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    expires_at   DATETIME(6)  NOT NULL,
    -- circuit breaker state as of the last heartbeat, for `ferry status`
    breaker      VARCHAR(16)  NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The relay's claim reads pending rows of one shard in id order (per
-- aggregate, id order is sequence order), so a backlog is read k rows at a
-- time instead of sorted whole on every poll.
CREATE INDEX {{.I "outbox_claim_idx"}} ON {{.T "outbox"}} (status, shard, id);

-- Dead rows hold their aggregate's later events (DeadHold): the claim
-- looks them up per owned shard on every cycle.
CREATE INDEX {{.I "outbox_dead_shard_idx"}} ON {{.T "outbox"}} (status, shard);
