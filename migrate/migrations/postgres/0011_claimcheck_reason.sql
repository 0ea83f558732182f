-- A new park reason: claimcheck (an offloaded payload missing or failing
-- its size/digest check, inbox.WithClaimCheck). 0010 named the CHECK.
ALTER TABLE {{.T "inbox_parked"}} DROP CONSTRAINT IF EXISTS {{.I "inbox_parked_reason_check"}};
ALTER TABLE {{.T "inbox_parked"}} ADD CONSTRAINT {{.I "inbox_parked_reason_check"}}
    CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable', 'decrypt', 'claimcheck'));
