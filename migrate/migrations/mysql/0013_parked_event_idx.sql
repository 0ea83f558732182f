-- Evidence by event id looks a parked message up by event_id alone (see
-- the Postgres migration). InnoDB builds it in place, writes allowed.
CREATE INDEX {{.I "inbox_parked_event_idx"}} ON {{.T "inbox_parked"}} (event_id);
