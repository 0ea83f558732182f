package ops

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/partition"
)

// inboxClaims returns every consumer's claim of event id (evidence's
// Applied), ordered by consumer and tenant.
//
// The inbox's key is (consumer, tenant_id, event_id); an event id alone
// matches no prefix of it. A partitioned inbox (Postgres) has an index on
// event_id and is read by it. A plain inbox has none — one more index on
// every claim, the consumer's hot path, for an operator's lookup — so the
// lookup walks the key's distinct (consumer, tenant_id) pairs in order, one
// index step each, and probes each pair's claim by the full key: cost grows
// with the number of consumer × tenant pairs, not with the table, where a
// WHERE event_id = … alone reads every claim ever kept.
func (o *Ops) inboxClaims(ctx context.Context, exec driver.Executor, id string) ([]Applied, error) {
	parted, err := partition.IsPartitioned(ctx, exec, o.cfg.tables, partition.Inbox)
	if err != nil {
		return nil, fmt.Errorf("ops: evidence inbox: %w", err)
	}
	inbox := o.t("inbox")
	if parted {
		claims, _, err := o.scanClaims(ctx, exec, fmt.Sprintf(`SELECT consumer, tenant_id, applied_at, fingerprint FROM %s WHERE event_id = $1 ORDER BY consumer, tenant_id`, inbox), id)
		return claims, err
	}
	// The next pair after ($2, $3): a row comparison Postgres and SQLite
	// read as one index range; MySQL's range optimizer wants it spelled out.
	after := `(consumer, tenant_id) > ($2, $3)`
	if o.mysql() {
		after = `(consumer > $2 OR (consumer = $2 AND tenant_id > $3))`
	}
	step := func(where string) string {
		return fmt.Sprintf(`SELECT n.consumer, n.tenant_id, i.applied_at, i.fingerprint
FROM (SELECT consumer, tenant_id FROM %[1]s %[2]s ORDER BY consumer, tenant_id LIMIT 1) n
LEFT JOIN %[1]s i ON i.consumer = n.consumer AND i.tenant_id = n.tenant_id AND i.event_id = $1`, inbox, where)
	}
	first, next := step(""), step("WHERE "+after)
	var out []Applied
	q, args := first, []any{id}
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("ops: evidence inbox: %w", err)
		}
		claims, last, err := o.scanClaims(ctx, exec, q, args...)
		if err != nil {
			return nil, err
		}
		if last == nil {
			return out, nil
		}
		out = append(out, claims...)
		q, args = next, []any{id, last[0], last[1]}
	}
}

// scanClaims runs q (consumer, tenant_id, applied_at, fingerprint) and
// returns the claims (rows with an applied_at) and the last row's
// (consumer, tenant_id), nil when q returned no row.
func (o *Ops) scanClaims(ctx context.Context, exec driver.Executor, q string, args ...any) ([]Applied, *[2]string, error) {
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("ops: evidence inbox: %w", err)
	}
	defer rows.Close()
	var out []Applied
	var last *[2]string
	for rows.Next() {
		var a Applied
		var at nullTime
		var fp []byte
		if err := rows.Scan(&a.Consumer, &a.TenantID, &at, &fp); err != nil {
			return nil, nil, fmt.Errorf("ops: evidence inbox: %w", err)
		}
		last = &[2]string{a.Consumer, a.TenantID}
		if at.Valid {
			a.AppliedAt, a.Fingerprint = at.Time, hex.EncodeToString(fp)
			out = append(out, a)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("ops: evidence inbox: %w", err)
	}
	return out, last, nil
}
