package effect

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// Ledger records effect intents and answers evidence queries. It is safe for
// concurrent use and holds no connection of its own beyond the driver's.
type Ledger[TTx any] struct {
	drv    driver.Driver[TTx]
	tables ferry.Tables
	now    func() time.Time
	sql    statements
}

type ledgerConfig struct {
	tables ferry.Tables
	now    func() time.Time
}

// LedgerOption configures a Ledger.
type LedgerOption func(*ledgerConfig)

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) LedgerOption { return func(c *ledgerConfig) { c.tables = t } }

// WithClock overrides time.Now for the ledger and every worker built on it (tests).
func WithClock(now func() time.Time) LedgerOption { return func(c *ledgerConfig) { c.now = now } }

// NewLedger returns a Ledger over drv.
func NewLedger[TTx any](drv driver.Driver[TTx], opts ...LedgerOption) (*Ledger[TTx], error) {
	cfg := ledgerConfig{now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.tables.Check(); err != nil {
		return nil, err
	}
	switch drv.Dialect() {
	case driver.Postgres, driver.SQLite, driver.MySQL:
	default:
		return nil, &ferry.ConfigError{Field: "dialect", Reason: fmt.Sprintf("unsupported dialect %q", drv.Dialect())}
	}
	return &Ledger[TTx]{drv: drv, tables: cfg.tables, now: cfg.now, sql: newStatements(cfg.tables, drv.Dialect())}, nil
}

// RecordTx records in inside tx, the consumer's transaction: the intent
// exists if and only if the handler's transaction commits, exactly like an
// outbox row. It returns the idempotency key (Key(in.Consumer, in.EventID,
// in.Step)). Recording the same (consumer, event, step) again — a redelivered
// handler — is a no-op returning the same key; recording it with a different
// Request is an *IntentConflictError.
//
// On Postgres a failed statement aborts tx: roll it back on error.
func (l *Ledger[TTx]) RecordTx(ctx context.Context, tx TTx, in Intent) (string, error) {
	return l.record(ctx, l.drv.UnwrapExecutor(tx), in)
}

// Record records in in a transaction of its own. Prefer RecordTx: an intent
// recorded outside the handler's transaction can outlive a rolled-back handler.
func (l *Ledger[TTx]) Record(ctx context.Context, in Intent) (string, error) {
	return l.record(ctx, l.drv.Executor(), in)
}

func (l *Ledger[TTx]) record(ctx context.Context, exec driver.Executor, in Intent) (string, error) {
	if err := in.check(); err != nil {
		return "", err
	}
	key := Key(in.Consumer, in.EventID, in.Step)
	sum := sha256.Sum256(in.Request)
	req := in.Request
	if req == nil {
		req = []byte{}
	}
	now := l.now().UTC()
	n, err := exec.Exec(ctx, l.sql.insert, key, in.Consumer, in.EventID.String(), in.Step, in.TenantID, in.Target, in.Operation, req, sum[:], now)
	if err != nil {
		return "", fmt.Errorf("effect: record intent %s: %w", key, err)
	}
	if n == 1 {
		return key, nil
	}
	rows, err := exec.Query(ctx, l.sql.requestSHA, key)
	if err != nil {
		return "", fmt.Errorf("effect: record intent %s: %w", key, err)
	}
	defer rows.Close()
	var stored []byte
	if rows.Next() {
		err = rows.Scan(&stored)
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return "", fmt.Errorf("effect: record intent %s: %w", key, err)
	}
	if !bytes.Equal(stored, sum[:]) {
		return "", &IntentConflictError{Key: key, Consumer: in.Consumer, EventID: in.EventID, Step: in.Step}
	}
	return key, nil
}

// Record is one ledger row, for evidence: it links the effect to the event
// and consumer that caused it and says what the outside system answered.
type Record struct {
	Key             string
	Consumer        string
	EventID         uuid.UUID
	Step            string
	TenantID        string
	Target          string
	Operation       string
	State           State
	Attempts        int
	Reconciliations int
	OperationID     string
	ResponseSummary string
	LastError       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	NextAttemptAt   time.Time
	// UnknownSince is when the effect last became unknown; zero if never.
	UnknownSince time.Time
	// CompletedAt is when it reached succeeded or failed; zero if not yet.
	CompletedAt time.Time
}

// ByEvent returns every ledger row caused by eventID (all consumers, all
// steps), for "did it really happen?" evidence: state, provider operation
// id, attempts, reconciliations and timestamps. exec may be a pool or a
// transaction of either dialect.
func ByEvent(ctx context.Context, exec driver.Executor, tables ferry.Tables, eventID uuid.UUID) ([]Record, error) {
	if err := tables.Check(); err != nil {
		return nil, err
	}
	q := selectRecords(tables, exec.Dialect()) + ` WHERE event_id = $1 ORDER BY consumer, step`
	return queryRecords(ctx, exec, q, eventID.String())
}

// ByKey returns the ledger row with idempotency key key, and false if none.
func ByKey(ctx context.Context, exec driver.Executor, tables ferry.Tables, key string) (Record, bool, error) {
	if err := tables.Check(); err != nil {
		return Record{}, false, err
	}
	recs, err := queryRecords(ctx, exec, selectRecords(tables, exec.Dialect())+` WHERE idem_key = $1`, key)
	if err != nil || len(recs) == 0 {
		return Record{}, false, err
	}
	return recs[0], true, nil
}

// ByEvent is the package-level ByEvent on the ledger's pool and tables.
func (l *Ledger[TTx]) ByEvent(ctx context.Context, eventID uuid.UUID) ([]Record, error) {
	return ByEvent(ctx, l.drv.Executor(), l.tables, eventID)
}

// ByKey is the package-level ByKey on the ledger's pool and tables.
func (l *Ledger[TTx]) ByKey(ctx context.Context, key string) (Record, bool, error) {
	return ByKey(ctx, l.drv.Executor(), l.tables, key)
}

func selectRecords(t ferry.Tables, d driver.Dialect) string {
	text := "TEXT"
	if d == driver.MySQL {
		text = "CHAR"
	}
	return `SELECT idem_key, consumer, CAST(event_id AS ` + text + `), step, tenant_id, target, operation, state, attempts, reconciliations,
operation_id, response_summary, last_error, created_at, updated_at, next_attempt_at, unknown_since, completed_at FROM ` + t.Name("effects")
}

func queryRecords(ctx context.Context, exec driver.Executor, q string, args ...any) ([]Record, error) {
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("effect: query ledger: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var (
			r        Record
			ev       string
			state    string
			unk, cmp sql.NullTime
		)
		if err := rows.Scan(&r.Key, &r.Consumer, &ev, &r.Step, &r.TenantID, &r.Target, &r.Operation, &state, &r.Attempts, &r.Reconciliations,
			&r.OperationID, &r.ResponseSummary, &r.LastError, &r.CreatedAt, &r.UpdatedAt, &r.NextAttemptAt, &unk, &cmp); err != nil {
			return nil, fmt.Errorf("effect: scan ledger: %w", err)
		}
		if r.EventID, err = uuid.Parse(ev); err != nil {
			return nil, fmt.Errorf("effect: scan ledger event id: %w", err)
		}
		r.State = State(state)
		if unk.Valid {
			r.UnknownSince = unk.Time
		}
		if cmp.Valid {
			r.CompletedAt = cmp.Time
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effect: query ledger: %w", err)
	}
	return out, nil
}

// Stats is a snapshot of the ledger.
type Stats struct {
	// ByState counts intents per state (every state present, zero included).
	ByState map[State]int64
	// OldestUnknown is the age of the oldest unknown intent; zero if none.
	OldestUnknown time.Duration
}

// Stats counts intents by state and measures the oldest unknown one.
func (l *Ledger[TTx]) Stats(ctx context.Context) (Stats, error) {
	return stats(ctx, l.drv.Executor(), l.sql, l.now().UTC())
}

func stats(ctx context.Context, exec driver.Executor, s statements, now time.Time) (Stats, error) {
	st := Stats{ByState: make(map[State]int64, len(States))}
	for _, s := range States {
		st.ByState[s] = 0
	}
	rows, err := exec.Query(ctx, s.countByState)
	if err != nil {
		return st, fmt.Errorf("effect: stats: %w", err)
	}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			rows.Close()
			return st, fmt.Errorf("effect: stats: %w", err)
		}
		st.ByState[State(state)] = n
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return st, fmt.Errorf("effect: stats: %w", err)
	}
	rows, err = exec.Query(ctx, s.oldestUnknown)
	if err != nil {
		return st, fmt.Errorf("effect: stats: %w", err)
	}
	defer rows.Close()
	var oldest sql.NullTime
	if rows.Next() {
		if err := rows.Scan(&oldest); err != nil {
			return st, fmt.Errorf("effect: stats: %w", err)
		}
	}
	if oldest.Valid && now.After(oldest.Time) {
		st.OldestUnknown = now.Sub(oldest.Time)
	}
	return st, rows.Err()
}

// skipTargets marks where the claim leaves out the targets whose call
// slots are all taken in the claiming worker (claimSkipping).
const skipTargets = "{{skip}}"

// claimSkipping renders a claim statement that leaves out skip's targets,
// as parameters $5, $6, …
func claimSkipping(q string, skip []string) string {
	if len(skip) == 0 {
		return strings.Replace(q, skipTargets, "", 1)
	}
	var b strings.Builder
	b.WriteString(" AND target NOT IN (")
	for i := range skip {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$" + strconv.Itoa(i+5))
	}
	b.WriteString(")")
	return strings.Replace(q, skipTargets, b.String(), 1)
}

// statements is the ledger's SQL, rendered once per dialect and tables.
type statements struct {
	insert, requestSHA, claim                                        string
	start, unstart, release, succeed, fail, retry, unknown, notFound string
	countByState, oldestUnknown                                      string
	// MySQL: the claim without RETURNING (mysql.go).
	mysqlPick, mysqlReadBack string
}

func newStatements(t ferry.Tables, d driver.Dialect) statements {
	n := t.Name("effects")
	lock := ""
	if d == driver.Postgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	st := statements{
		insert: fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, tenant_id, target, operation, request, request_sha,
    state, next_attempt_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $10, $10) ON CONFLICT (idem_key) DO NOTHING`, n),
		requestSHA: fmt.Sprintf(`SELECT request_sha FROM %s WHERE idem_key = $1`, n),
		// Claim due rows under a lease. An in_flight row whose lease expired
		// belonged to a worker that died mid-call: it becomes unknown.
		// $1 owner, $2 lease until, $3 now, $4 limit, then the targets to
		// skip (claimSkipping).
		claim: fmt.Sprintf(`UPDATE %[1]s SET lease_owner = $1, lease_until = $2, updated_at = $3,
    last_error = CASE WHEN state = 'in_flight' THEN 'lease expired while in flight (worker died mid-call?)' ELSE last_error END,
    unknown_since = CASE WHEN state = 'in_flight' THEN $3 ELSE unknown_since END,
    state = CASE WHEN state = 'in_flight' THEN 'unknown' ELSE state END
WHERE id IN (SELECT id FROM %[1]s
    WHERE ((state IN ('pending', 'unknown') AND next_attempt_at <= $3 AND (lease_until IS NULL OR lease_until < $3))
       OR (state = 'in_flight' AND lease_until < $3))`+skipTargets+`
    ORDER BY next_attempt_at, id LIMIT $4%[2]s)
RETURNING id, idem_key, consumer, CAST(event_id AS TEXT), step, tenant_id, target, operation, request, state, attempts, reconciliations`, n, lock),
		// Committed before the call: the attempt is on record even if the
		// worker dies during it. $1 id, $2 owner, $3 lease until, $4 now.
		start: fmt.Sprintf(`UPDATE %s SET state = 'in_flight', attempts = attempts + 1, lease_until = $3, updated_at = $4
WHERE id = $1 AND lease_owner = $2 AND state = 'pending' AND lease_until > $4`, n),
		// The worker started the attempt and then did not call (the start
		// came too late for its lease to cover a call): nothing was sent,
		// so the attempt is taken back and the intent waits for its next
		// one. A claim that took the row over meanwhile (another owner, or
		// the row already unknown) is left alone. $1 id, $2 owner, $3 next
		// attempt, $4 now.
		unstart: fmt.Sprintf(`UPDATE %s SET state = 'pending', attempts = attempts - 1, next_attempt_at = $3, updated_at = $4,
    lease_owner = '', lease_until = NULL
WHERE id = $1 AND lease_owner = $2 AND state = 'in_flight'`, n),
		// $1 id, $2 owner, $3 next attempt, $4 now.
		release: fmt.Sprintf(`UPDATE %s SET lease_owner = '', lease_until = NULL, next_attempt_at = $3, updated_at = $4
WHERE id = $1 AND lease_owner = $2`, n),
		// $1 id, $2 owner, $3 operation id, $4 summary, $5 reconciliations added, $6 now.
		succeed: fmt.Sprintf(`UPDATE %s SET state = 'succeeded', operation_id = $3, response_summary = $4, last_error = '',
    reconciliations = reconciliations + $5, completed_at = $6, updated_at = $6, lease_owner = '', lease_until = NULL
WHERE id = $1 AND lease_owner = $2`, n),
		// $1 id, $2 owner, $3 error, $4 reconciliations added, $5 now, $6 summary.
		fail: fmt.Sprintf(`UPDATE %s SET state = 'failed', last_error = $3, reconciliations = reconciliations + $4,
    response_summary = $6, completed_at = $5, updated_at = $5, lease_owner = '', lease_until = NULL
WHERE id = $1 AND lease_owner = $2`, n),
		// Not sent: back to pending after backoff. $1 id, $2 owner, $3 next, $4 error, $5 now.
		retry: fmt.Sprintf(`UPDATE %s SET state = 'pending', next_attempt_at = $3, last_error = $4, updated_at = $5,
    lease_owner = '', lease_until = NULL
WHERE id = $1 AND lease_owner = $2`, n),
		// $1 id, $2 owner, $3 next (reconcile at), $4 error, $5 reconciliations added, $6 now.
		unknown: fmt.Sprintf(`UPDATE %s SET unknown_since = CASE WHEN state = 'unknown' THEN unknown_since ELSE $6 END,
    state = 'unknown', next_attempt_at = $3, last_error = $4, reconciliations = reconciliations + $5, updated_at = $6,
    lease_owner = '', lease_until = NULL
WHERE id = $1 AND lease_owner = $2`, n),
		// The status query said "not found": executing again (same key) is
		// safe. The lease is kept: the same worker goes on to execute.
		// $1 id, $2 owner, $3 now.
		notFound: fmt.Sprintf(`UPDATE %s SET state = 'pending', reconciliations = reconciliations + 1, updated_at = $3
WHERE id = $1 AND lease_owner = $2 AND state = 'unknown'`, n),
		countByState:  fmt.Sprintf(`SELECT state, count(*) FROM %s GROUP BY state`, n),
		oldestUnknown: fmt.Sprintf(`SELECT unknown_since FROM %s WHERE state = 'unknown' AND unknown_since IS NOT NULL ORDER BY unknown_since LIMIT 1`, n),
	}
	if d == driver.MySQL {
		mysqlStatements(&st, n)
	}
	return st
}
