-- The watermark relay state (see the Postgres migration). The watermark
-- mode runs on Postgres only; the columns exist here so every dialect has
-- the same lease and instance rows.
ALTER TABLE {{.Bare "relay_leases"}} ADD COLUMN sent_up_to INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Bare "relay_instances"}} ADD COLUMN relay_state TEXT NOT NULL DEFAULT 'status';
