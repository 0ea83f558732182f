-- Outbox search (ferry console, issue 14): one index per search criterion,
-- each ending in id, so a page is "criterion = x AND id < cursor ORDER BY
-- id DESC LIMIT n" read from the index, whatever the outbox holds.
-- Correlation ids (outbox_correlation_idx) and event ids (unique) are
-- indexed already.
CREATE INDEX {{.I "outbox_tenant_id_idx"}} ON {{.T "outbox"}} (tenant_id, id);
CREATE INDEX {{.I "outbox_aggregate_id_idx"}} ON {{.T "outbox"}} (aggregate_type, aggregate_id, id);
CREATE INDEX {{.I "outbox_created_idx"}} ON {{.T "outbox"}} (created_at, id);
CREATE INDEX {{.I "outbox_unsent_id_idx"}} ON {{.T "outbox"}} (status, id);
-- The audit log page filters by actor and action, newest first.
CREATE INDEX {{.I "ops_audit_actor_idx"}} ON {{.T "ops_audit"}} (actor, id);
CREATE INDEX {{.I "ops_audit_action_idx"}} ON {{.T "ops_audit"}} (action, id);
