-- A new park reason: claimcheck (an offloaded payload missing or failing
-- its size/digest check, inbox.WithClaimCheck). SQLite cannot alter a
-- CHECK constraint, so inbox_parked is rebuilt as in 0010: same columns,
-- same indexes, same ids and AUTOINCREMENT counter.
CREATE TABLE {{.T "inbox_parked_new"}} (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer          TEXT      NOT NULL,
    reason            TEXT      NOT NULL CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable', 'decrypt', 'claimcheck')),
    park_key          TEXT      NOT NULL,
    attempts          INTEGER   NOT NULL DEFAULT 1,
    first_seen        TIMESTAMP NOT NULL,
    last_seen         TIMESTAMP NOT NULL,
    last_error        TEXT      NOT NULL DEFAULT '',
    resolved_at       TIMESTAMP,
    resolution        TEXT      NOT NULL DEFAULT '',
    tenant_id         TEXT      NOT NULL DEFAULT '',
    event_id          TEXT,
    aggregate_type    TEXT      NOT NULL DEFAULT '',
    aggregate_id      TEXT      NOT NULL DEFAULT '',
    aggregate_seq     INTEGER   NOT NULL DEFAULT 0,
    event_type        TEXT      NOT NULL DEFAULT '',
    schema_version    INTEGER   NOT NULL DEFAULT 0,
    content_type      TEXT      NOT NULL DEFAULT '',
    payload           BLOB      NOT NULL DEFAULT x'',
    occurred_at       TIMESTAMP,
    topic             TEXT      NOT NULL DEFAULT '',
    traceparent       TEXT      NOT NULL DEFAULT '',
    correlation_id    TEXT      NOT NULL DEFAULT '',
    causation_id      TEXT      NOT NULL DEFAULT '',
    principal         TEXT      NOT NULL DEFAULT '',
    action            TEXT      NOT NULL DEFAULT '',
    target            TEXT      NOT NULL DEFAULT '',
    fingerprint       BLOB      NOT NULL DEFAULT x'',
    other_fingerprint BLOB      NOT NULL DEFAULT x'',
    raw_destination   TEXT      NOT NULL DEFAULT '',
    raw_key           TEXT      NOT NULL DEFAULT '',
    raw_headers       TEXT      NOT NULL DEFAULT '',
    raw_body          BLOB      NOT NULL DEFAULT x'',
    replay_requested_at TIMESTAMP,
    replay_request    TEXT      NOT NULL DEFAULT '' CHECK (replay_request IN ('', 'replay', 'release_gap')),
    replay_audit_id   INTEGER
);
INSERT INTO {{.T "inbox_parked_new"}} SELECT id, consumer, reason, park_key, attempts, first_seen, last_seen, last_error, resolved_at, resolution,
    tenant_id, event_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version, content_type, payload, occurred_at, topic,
    traceparent, correlation_id, causation_id, principal, action, target, fingerprint, other_fingerprint, raw_destination, raw_key, raw_headers,
    raw_body, replay_requested_at, replay_request, replay_audit_id FROM {{.T "inbox_parked"}};
DELETE FROM sqlite_sequence WHERE name = '{{.Bare "inbox_parked_new"}}';
UPDATE sqlite_sequence SET name = '{{.Bare "inbox_parked_new"}}' WHERE name = '{{.Bare "inbox_parked"}}';
DROP TABLE {{.T "inbox_parked"}};
ALTER TABLE {{.T "inbox_parked_new"}} RENAME TO {{.Bare "inbox_parked"}};
CREATE UNIQUE INDEX {{.I "inbox_parked_open_key"}} ON {{.Bare "inbox_parked"}} (consumer, park_key) WHERE resolved_at IS NULL;
CREATE INDEX {{.I "inbox_parked_gap_idx"}} ON {{.Bare "inbox_parked"}} (consumer, tenant_id, aggregate_type, aggregate_id, aggregate_seq) WHERE reason = 'gap' AND resolved_at IS NULL;
CREATE INDEX {{.I "inbox_parked_open_idx"}} ON {{.Bare "inbox_parked"}} (consumer, reason, first_seen) WHERE resolved_at IS NULL;
CREATE INDEX {{.I "inbox_parked_replay_idx"}} ON {{.Bare "inbox_parked"}} (consumer, id) WHERE replay_requested_at IS NOT NULL;
