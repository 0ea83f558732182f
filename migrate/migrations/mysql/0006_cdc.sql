-- CDC relay bookkeeping (relay/cdc, docs/CDC.md), kept for parity with the
-- Postgres schema: the CDC relay reads Postgres's logical replication and
-- does not run on MySQL yet (a binlog relay would use this table the same
-- way: catchup_needed is the durable "re-publish pending rows from the
-- table" marker, catchup_upto bounds that catch-up).
CREATE TABLE {{.T "cdc_slot"}} (
    slot_name       VARCHAR(255) NOT NULL PRIMARY KEY,
    publication     VARCHAR(255) NOT NULL,
    catchup_needed  BOOLEAN      NOT NULL DEFAULT TRUE,
    catchup_upto    BIGINT       NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    slot_created_at DATETIME(6)  NULL,
    lost_count      INT          NOT NULL DEFAULT 0,
    lost_at         DATETIME(6)  NULL,
    last_error      TEXT         NOT NULL DEFAULT ('')
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
