package prove

import (
	"context"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/driver"
)

// proveSchema holds the tables of the scenario's application: the business
// rows the producer commits with its events (the ground truth of "what
// committed"), the consumer's inbox, cursor, parked messages and applied
// log (no unique constraint: a duplicate effect must be visible, not
// prevented by the checker's own table), the effect ledger and the shard
// leases of the reference relay. Times are Unix nanoseconds so both
// dialects store them alike.
const proveSchema = `
CREATE TABLE prove_business (
    event_id   TEXT PRIMARY KEY,
    tx_id      BIGINT NOT NULL,
    tenant_id  TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    kind       TEXT NOT NULL
);
CREATE TABLE prove_inbox (
    consumer    TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    claimed_at  BIGINT NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE prove_cursor (
    consumer       TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    aggregate_type TEXT NOT NULL,
    aggregate_id   TEXT NOT NULL,
    last_seq       BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);
CREATE TABLE prove_applied (
    id             {{AUTO}},
    consumer       TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    aggregate_type TEXT NOT NULL,
    aggregate_id   TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    applied_at     BIGINT NOT NULL
);
CREATE TABLE prove_parked (
    consumer       TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    reason         TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    aggregate_type TEXT NOT NULL,
    aggregate_id   TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    event_type     TEXT NOT NULL,
    principal      TEXT NOT NULL,
    payload        {{BLOB}} NOT NULL,
    attempts       BIGINT NOT NULL,
    first_seen     BIGINT NOT NULL,
    last_seen      BIGINT NOT NULL,
    healed_at      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE prove_ledger (
    idem_key   TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    status     TEXT NOT NULL,
    attempts   BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL
);
CREATE TABLE prove_policy (
    principal TEXT NOT NULL,
    action    TEXT NOT NULL,
    allowed   INTEGER NOT NULL,
    PRIMARY KEY (principal, action)
);
CREATE TABLE prove_lease (
    shard      INTEGER PRIMARY KEY,
    owner      TEXT NOT NULL,
    fence      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
`

func createProveSchema(ctx context.Context, exec driver.Executor, shards int) error {
	ddl := proveSchema
	switch exec.Dialect() {
	case driver.Postgres:
		ddl = strings.NewReplacer("{{AUTO}}", "BIGSERIAL PRIMARY KEY", "{{BLOB}}", "BYTEA").Replace(ddl)
	case driver.MySQL:
		ddl = mysqlDDL(ddl)
	default:
		ddl = strings.NewReplacer("{{AUTO}}", "INTEGER PRIMARY KEY AUTOINCREMENT", "{{BLOB}}", "BLOB").Replace(ddl)
	}
	for _, stmt := range strings.Split(ddl, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := exec.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("prove: create schema: %w", err)
		}
	}
	for s := 0; s < shards; s++ {
		if _, err := exec.Exec(ctx, `INSERT INTO prove_lease (shard, owner, fence, expires_at) VALUES ($1, '', 0, 0)`, s); err != nil {
			return fmt.Errorf("prove: seed leases: %w", err)
		}
	}
	return nil
}
