-- The inbox (issue 4): see the Postgres migration for the reasoning.
CREATE TABLE {{.T "inbox"}} (
    consumer       TEXT      NOT NULL,
    tenant_id      TEXT      NOT NULL,
    event_id       TEXT      NOT NULL,
    fingerprint    BLOB      NOT NULL,
    aggregate_type TEXT      NOT NULL,
    aggregate_id   TEXT      NOT NULL,
    aggregate_seq  INTEGER   NOT NULL,
    event_type     TEXT      NOT NULL,
    applied_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (consumer, tenant_id, event_id)
);
CREATE INDEX {{.I "inbox_applied_idx"}} ON {{.Bare "inbox"}} (consumer, applied_at);

CREATE TABLE {{.T "inbox_cursor"}} (
    consumer       TEXT      NOT NULL,
    tenant_id      TEXT      NOT NULL,
    aggregate_type TEXT      NOT NULL,
    aggregate_id   TEXT      NOT NULL,
    last_seq       INTEGER   NOT NULL CHECK (last_seq >= 0),
    updated_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);

CREATE TABLE {{.T "inbox_parked"}} (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer          TEXT      NOT NULL,
    reason            TEXT      NOT NULL CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable')),
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
    raw_body          BLOB      NOT NULL DEFAULT x''
);
CREATE UNIQUE INDEX {{.I "inbox_parked_open_key"}} ON {{.Bare "inbox_parked"}} (consumer, park_key) WHERE resolved_at IS NULL;
CREATE INDEX {{.I "inbox_parked_gap_idx"}} ON {{.Bare "inbox_parked"}} (consumer, tenant_id, aggregate_type, aggregate_id, aggregate_seq) WHERE reason = 'gap' AND resolved_at IS NULL;
CREATE INDEX {{.I "inbox_parked_open_idx"}} ON {{.Bare "inbox_parked"}} (consumer, reason, first_seen) WHERE resolved_at IS NULL;
