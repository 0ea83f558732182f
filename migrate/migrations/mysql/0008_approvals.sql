-- Approvals (issue 15): an action an agent proposed (ferry mcp
-- request_action) waits here for a human (ferry approvals approve|reject)
-- or a policy. The row keeps the exact plan the proposer previewed and the
-- plan's hash; approval executes that plan only while the rows are still in
-- that state. Every step also writes an ops_audit row.
CREATE TABLE {{.T "ops_approvals"}} (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    created_at      DATETIME(6)  NOT NULL,
    action          VARCHAR(255) NOT NULL CHECK (action <> ''),
    spec            LONGTEXT     NOT NULL,
    plan_hash       VARCHAR(255) NOT NULL CHECK (plan_hash <> ''),
    row_count       BIGINT       NOT NULL CHECK (row_count >= 0),
    plan_rows       LONGTEXT     NOT NULL DEFAULT ('[]'),
    requested_by    VARCHAR(255) NOT NULL CHECK (requested_by <> ''),
    requested_agent BOOLEAN      NOT NULL,
    requested_via   VARCHAR(255) NOT NULL DEFAULT '',
    reason          TEXT         NOT NULL CHECK (reason <> ''),
    status          VARCHAR(16)  NOT NULL CHECK (status IN ('pending', 'approved', 'executed', 'rejected', 'refused')),
    decided_by      VARCHAR(255) NOT NULL DEFAULT '',
    decided_at      DATETIME(6)  NULL,
    decision_reason TEXT         NOT NULL DEFAULT (''),
    result          LONGTEXT     NOT NULL DEFAULT (''),
    audit_id        BIGINT       NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX {{.I "ops_approvals_status_idx"}} ON {{.T "ops_approvals"}} (status, id);
