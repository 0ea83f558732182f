-- The inbox (issue 4): what a consumer has applied, where each aggregate's
-- cursor stands, and the messages it parked instead of dropping. All three
-- are written in the consumer's own transaction, together with its effect.

-- One row per applied event: the dedup claim. The key carries the tenant so
-- one tenant can never suppress another's events by reusing an id; the
-- fingerprint (SHA-256 of the canonical envelope + payload) tells a true
-- duplicate from a collision (same id, different content).
CREATE TABLE {{.T "inbox"}} (
    consumer       text        NOT NULL,
    tenant_id      text        NOT NULL,
    event_id       uuid        NOT NULL,
    fingerprint    bytea       NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    aggregate_seq  bigint      NOT NULL,
    event_type     text        NOT NULL,
    applied_at     timestamptz NOT NULL,
    PRIMARY KEY (consumer, tenant_id, event_id)
){{if .PartitionedInbox}} PARTITION BY RANGE (event_id){{end}};
-- Cleanup by age (never shorter than the replay window); on a partitioned
-- inbox also the guard of a partition's drop (its newest claim per consumer).
CREATE INDEX {{.I "inbox_applied_idx"}} ON {{.T "inbox"}} (consumer, applied_at);
{{- if .PartitionedInbox}}
-- Partitioned (migrate.WithPartitionedInbox, docs/PARTITIONING.md): range
-- partitions of event_id, whose UUIDv7 time prefix makes each range an
-- interval of event time; the primary key contains the partition key, so
-- dedup (G4) holds over the whole table. Ids that are not UUIDv7s, or
-- outside the ranges made, go to this default partition, never dropped.
CREATE TABLE {{.T "inbox_default"}} PARTITION OF {{.T "inbox"}} DEFAULT;
-- Evidence reads the inbox by event id alone (every consumer that applied
-- an event): pruned to one partition, this index finds the rows there. It
-- also makes the default partition's check before a range is created a
-- range scan. (The plain inbox has no such index: ops walks its key's
-- (consumer, tenant_id) pairs instead, docs/PARTITIONING.md.)
CREATE INDEX {{.I "inbox_event_idx"}} ON {{.T "inbox"}} (event_id);
{{- end}}

-- Per-aggregate cursor: the last sequence this consumer applied. Locked
-- (FOR UPDATE) by the claim, so two instances cannot apply one aggregate
-- out of order.
CREATE TABLE {{.T "inbox_cursor"}} (
    consumer       text        NOT NULL,
    tenant_id      text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_seq       bigint      NOT NULL CHECK (last_seq >= 0),
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);

-- Parked messages: gap, schema, unauthorized, poison, collision,
-- undecodable. A row stays open (resolved_at IS NULL) until a replay,
-- a gap fill or an operator resolves it; resolved rows are kept as evidence.
CREATE TABLE {{.T "inbox_parked"}} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer          text        NOT NULL,
    reason            text        NOT NULL CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable')),
    -- tenant/event_id/fingerprint, or raw:<sha256> for undecodable messages:
    -- one open row per distinct message, however often it is redelivered.
    park_key          text        NOT NULL,
    attempts          integer     NOT NULL DEFAULT 1,
    first_seen        timestamptz NOT NULL,
    last_seen         timestamptz NOT NULL,
    last_error        text        NOT NULL DEFAULT '',
    resolved_at       timestamptz,
    resolution        text        NOT NULL DEFAULT '',
    -- the envelope and payload, enough to replay through the live path
    tenant_id         text        NOT NULL DEFAULT '',
    event_id          uuid,
    aggregate_type    text        NOT NULL DEFAULT '',
    aggregate_id      text        NOT NULL DEFAULT '',
    aggregate_seq     bigint      NOT NULL DEFAULT 0,
    event_type        text        NOT NULL DEFAULT '',
    schema_version    integer     NOT NULL DEFAULT 0,
    content_type      text        NOT NULL DEFAULT '',
    payload           bytea       NOT NULL DEFAULT '\x',
    occurred_at       timestamptz,
    topic             text        NOT NULL DEFAULT '',
    traceparent       text        NOT NULL DEFAULT '',
    correlation_id    text        NOT NULL DEFAULT '',
    causation_id      text        NOT NULL DEFAULT '',
    principal         text        NOT NULL DEFAULT '',
    action            text        NOT NULL DEFAULT '',
    target            text        NOT NULL DEFAULT '',
    fingerprint       bytea       NOT NULL DEFAULT '\x',
    -- collision: the fingerprint of the event already applied under this key
    other_fingerprint bytea       NOT NULL DEFAULT '\x',
    -- undecodable: the message as received (bounded)
    raw_destination   text        NOT NULL DEFAULT '',
    raw_key           text        NOT NULL DEFAULT '',
    raw_headers       text        NOT NULL DEFAULT '',
    raw_body          bytea       NOT NULL DEFAULT '\x'
);
CREATE UNIQUE INDEX {{.I "inbox_parked_open_key"}} ON {{.T "inbox_parked"}} (consumer, park_key) WHERE resolved_at IS NULL;
-- Gap successors of an aggregate, in order.
CREATE INDEX {{.I "inbox_parked_gap_idx"}} ON {{.T "inbox_parked"}} (consumer, tenant_id, aggregate_type, aggregate_id, aggregate_seq) WHERE reason = 'gap' AND resolved_at IS NULL;
-- Listing and metrics: open rows by reason and age.
CREATE INDEX {{.I "inbox_parked_open_idx"}} ON {{.T "inbox_parked"}} (consumer, reason, first_seen) WHERE resolved_at IS NULL;
