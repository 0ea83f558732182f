-- Relay shard leases (DESIGN §5): one row per shard. A relay owns a shard
-- while expires_at (database clock) is in the future and owner is its
-- instance id. fence only ever increases: every acquisition bumps it, and
-- every state change a relay writes to the outbox is conditional on the
-- (owner, fence) it claimed with, so a relay that lost its lease cannot
-- overwrite the new owner's work.
CREATE TABLE {{.T "relay_leases"}} (
    shard      integer     PRIMARY KEY CHECK (shard >= 0),
    owner      text        NOT NULL DEFAULT '',
    fence      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00'
);

-- Live relay instances (heartbeats), for rebalancing: with N live
-- instances each takes about ceil(shards / N) leases.
CREATE TABLE {{.T "relay_instances"}} (
    instance_id  text        PRIMARY KEY,
    shard_count  integer     NOT NULL CHECK (shard_count >= 1),
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    -- circuit breaker state as of the last heartbeat, for `ferry status`
    breaker      text        NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open'))
);

-- The relay's claim reads pending rows of one shard in id order (per
-- aggregate, id order is sequence order), so a backlog is read k rows at a
-- time instead of sorted whole on every poll.
CREATE INDEX {{.I "outbox_claim_idx"}} ON {{.T "outbox"}} (shard, id) WHERE status = 'pending';

-- Dead rows hold their aggregate's later events (DeadHold): the claim
-- looks them up per owned shard on every cycle. Dead rows are few, so the
-- index is small and costs nothing for rows that are not dead.
CREATE INDEX {{.I "outbox_dead_shard_idx"}} ON {{.T "outbox"}} (shard) WHERE status = 'dead';
