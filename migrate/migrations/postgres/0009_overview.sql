-- The overview at scale (ferry console, issue 14): with 100,000 dead
-- letters spread over a 1,000,000-row outbox, ferry status's per-shard
-- aggregate and the dead-letter count read ~30,000 heap pages (0.5-0.9 s
-- cold). Both become index-only scans of partial indexes over unsent rows
-- only, which the sent majority never enters; the dead-letter index leads
-- with topic so the DLQ's count by topic is index-only too (measurements
-- in docs/PERFORMANCE.md).
CREATE INDEX {{.I "outbox_unsent_status_idx"}} ON {{.T "outbox"}} (topic, shard, status, created_at, discarded_at) WHERE status <> 'sent';
CREATE INDEX {{.I "outbox_dead_open_idx"}} ON {{.T "outbox"}} (topic, id) WHERE status = 'dead' AND discarded_at IS NULL;
