-- CDC relay bookkeeping (relay/cdc, docs/CDC.md): one row per replication
-- slot the relay manages. The row outlives the slot, which is how a slot
-- dropped or invalidated while no relay ran is told apart from a first
-- start; catchup_needed is the durable "re-publish pending rows from the
-- table" marker, set before a slot is (re)created and cleared only after
-- that catch-up was published and recorded, so a crash in between repeats
-- the catch-up instead of skipping it. catchup_upto bounds that catch-up to
-- rows visible in the slot's exported snapshot (max id at the slot's
-- consistent point): later rows arrive through the slot itself.
CREATE TABLE {{.T "cdc_slot"}} (
    slot_name       text        PRIMARY KEY,
    publication     text        NOT NULL,
    catchup_needed  boolean     NOT NULL DEFAULT true,
    catchup_upto    bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    slot_created_at timestamptz,
    lost_count      integer     NOT NULL DEFAULT 0,
    lost_at         timestamptz,
    last_error      text        NOT NULL DEFAULT ''
);
