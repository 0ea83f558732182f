-- Evidence by event id (ops.Evidence, `ferry evidence`, the console and
-- MCP) looks a parked message up by event_id alone; without an index that
-- read the whole parked table, resolved rows included (they are kept as
-- evidence). Rows parked as undecodable have no event id: not indexed.
-- The parked table is small next to the outbox and the inbox (one row per
-- distinct message that could not be applied), so the index is built
-- while writes to it wait — parks are rare and retry.
CREATE INDEX {{.I "inbox_parked_event_idx"}} ON {{.T "inbox_parked"}} (event_id) WHERE event_id IS NOT NULL;
