-- Relay state out of the event row (issue 17, relay.WithSentWatermark,
-- docs/PERFORMANCE.md "Recommendation"). A relay in watermark mode does
-- not update an event row when the broker acks it: it moves its shard's
-- sent_up_to instead, one small update per shard per batch. A row of the
-- shard is sent when its status is 'sent', or it is 'pending' with an id
-- at or below the shard's sent_up_to. Rows the relay could not send get a
-- state of their own before the watermark passes them: 'retry' (failed,
-- held behind their aggregate's failed head, held for a destination, or a
-- late commit the watermark reached first), or 'dead'.
--
-- Every statement here is cheap on a large outbox: a column with a
-- constant default is catalog-only, the CHECK is added NOT VALID (existing
-- rows satisfy it: it only widens the old one), and the retry index is
-- built over a table that has no retry row yet (a full read, but no sort
-- and no index entries). Relays of earlier versions keep running after
-- it: they do not know the columns, and the instance state they leave at
-- its default ('status') makes a watermark relay refuse to start beside
-- them.
ALTER TABLE {{.T "relay_leases"}} ADD COLUMN sent_up_to bigint NOT NULL DEFAULT 0;
ALTER TABLE {{.T "relay_instances"}} ADD COLUMN relay_state text NOT NULL DEFAULT 'status';

-- The status CHECK was created unnamed in 0001; find it by its definition.
DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
        WHERE conrelid = '{{.T "outbox"}}'::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%status%' AND pg_get_constraintdef(oid) LIKE '%pending%'
    LOOP
        EXECUTE format('ALTER TABLE {{.T "outbox"}} DROP CONSTRAINT %I', c);
    END LOOP;
END $$;
ALTER TABLE {{.T "outbox"}} ADD CONSTRAINT {{.I "outbox_status_check"}}
    CHECK (status IN ('pending', 'sent', 'dead', 'retry')) NOT VALID;

-- The watermark relay's claim: retry rows of a shard (due ones are claimed,
-- later ones hold their aggregate). Few at any time.
CREATE INDEX {{.I "outbox_retry_idx"}} ON {{.T "outbox"}} (shard, next_attempt_at, id) WHERE status = 'retry';

-- When the watermarks passed which ids: entries a minute apart per
-- shard, the newest moved forward by every advance (relay/watermark.go). Rows carry no published_at in the
-- watermark design, so `ferry cleanup` deletes a shard's rows up to the
-- highest watermark recorded before the retention cutoff (they were all
-- published by then), and prunes the entries it no longer needs.
CREATE TABLE {{.T "relay_watermarks"}} (
    shard      integer     NOT NULL,
    sent_up_to bigint      NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, at)
);
