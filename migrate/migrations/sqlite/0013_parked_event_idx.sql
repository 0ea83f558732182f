-- Evidence by event id looks a parked message up by event_id alone (see
-- the Postgres migration). A table rebuild of inbox_parked (as 0010 and
-- 0011 did) must create this index again.
CREATE INDEX {{.I "inbox_parked_event_idx"}} ON {{.T "inbox_parked"}} (event_id) WHERE event_id IS NOT NULL;
