-- The overview at scale (ferry console, issue 14): ferry status's per-shard
-- aggregate and the dead-letter count by topic read these indexes instead
-- of the table. MySQL has no partial indexes, so they cover every row
-- (sent ones included) and lead with the columns the counts group by.
CREATE INDEX {{.I "outbox_unsent_status_idx"}} ON {{.T "outbox"}} (status, topic, shard, created_at, discarded_at);
CREATE INDEX {{.I "outbox_dead_open_idx"}} ON {{.T "outbox"}} (status, discarded_at, topic, id);
