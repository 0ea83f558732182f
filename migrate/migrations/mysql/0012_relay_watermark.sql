-- The watermark relay state (see the Postgres migration). The watermark
-- mode runs on Postgres only; the columns exist here so every dialect has
-- the same lease and instance rows.
ALTER TABLE {{.T "relay_leases"}} ADD COLUMN sent_up_to BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {{.T "relay_instances"}} ADD COLUMN relay_state VARCHAR(16) NOT NULL DEFAULT 'status';
