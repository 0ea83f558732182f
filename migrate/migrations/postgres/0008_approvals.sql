-- Approvals (issue 15): an action an agent proposed (ferry mcp
-- request_action) waits here for a human (ferry approvals approve|reject)
-- or a policy. The row keeps the exact plan the proposer previewed — the
-- action, its filter and every row with the state it was in — and the
-- plan's hash; approval executes that plan only while the rows are still in
-- that state. requested_by is the authenticated identity, never a name the
-- client typed. Every step also writes an ops_audit row.
CREATE TABLE {{.T "ops_approvals"}} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      timestamptz NOT NULL,
    action          text        NOT NULL CHECK (action <> ''),
    spec            text        NOT NULL,
    plan_hash       text        NOT NULL CHECK (plan_hash <> ''),
    row_count       bigint      NOT NULL CHECK (row_count >= 0),
    plan_rows       text        NOT NULL DEFAULT '[]',
    requested_by    text        NOT NULL CHECK (requested_by <> ''),
    requested_agent boolean     NOT NULL,
    requested_via   text        NOT NULL DEFAULT '',
    reason          text        NOT NULL CHECK (reason <> ''),
    status          text        NOT NULL CHECK (status IN ('pending', 'approved', 'executed', 'rejected', 'refused')),
    decided_by      text        NOT NULL DEFAULT '',
    decided_at      timestamptz,
    decision_reason text        NOT NULL DEFAULT '',
    result          text        NOT NULL DEFAULT '',
    audit_id        bigint
);
CREATE INDEX {{.I "ops_approvals_status_idx"}} ON {{.T "ops_approvals"}} (status, id);
