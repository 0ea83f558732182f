-- Approvals (issue 15): see the Postgres file.
CREATE TABLE {{.T "ops_approvals"}} (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at      TIMESTAMP NOT NULL,
    action          TEXT      NOT NULL CHECK (action <> ''),
    spec            TEXT      NOT NULL,
    plan_hash       TEXT      NOT NULL CHECK (plan_hash <> ''),
    row_count       INTEGER   NOT NULL CHECK (row_count >= 0),
    plan_rows       TEXT      NOT NULL DEFAULT '[]',
    requested_by    TEXT      NOT NULL CHECK (requested_by <> ''),
    requested_agent INTEGER   NOT NULL CHECK (requested_agent IN (0, 1)),
    requested_via   TEXT      NOT NULL DEFAULT '',
    reason          TEXT      NOT NULL CHECK (reason <> ''),
    status          TEXT      NOT NULL CHECK (status IN ('pending', 'approved', 'executed', 'rejected', 'refused')),
    decided_by      TEXT      NOT NULL DEFAULT '',
    decided_at      TIMESTAMP,
    decision_reason TEXT      NOT NULL DEFAULT '',
    result          TEXT      NOT NULL DEFAULT '',
    audit_id        INTEGER
);
CREATE INDEX {{.I "ops_approvals_status_idx"}} ON {{.Bare "ops_approvals"}} (status, id);
