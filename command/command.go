package command

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// ErrIdempotencyKeyReused is matched (errors.Is) by a *KeyReusedError: the
// key was already used by a request with another fingerprint. Nothing ran.
var ErrIdempotencyKeyReused = errors.New("command: idempotency key reused with a different request")

// ErrInvalidRequest is matched by a *RequestError: a Request field broke a
// limit. Nothing ran.
var ErrInvalidRequest = errors.New("command: invalid request")

// KeyReusedError names the tenant and key that were reused.
type KeyReusedError struct {
	TenantID string
	Key      string
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("command: idempotency key %q of tenant %q was already used with a different request", e.Key, e.TenantID)
}

// Is reports ErrIdempotencyKeyReused.
func (e *KeyReusedError) Is(target error) bool { return target == ErrIdempotencyKeyReused }

// RequestError names the Request field that was rejected and why.
type RequestError struct {
	Field  string
	Reason string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("command: invalid request.%s: %s", e.Field, e.Reason)
}

// Is reports ErrInvalidRequest.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }

// Limits on request fields.
const (
	MaxKeyBytes      = 255
	MaxTenantBytes   = 255
	MaxResultBytes   = 64 << 10
	MaxEventsPerCall = 1000
)

// Defaults.
const (
	// DefaultExpiry is how long a key is remembered when no WithExpiry is given.
	DefaultExpiry = 48 * time.Hour
)

// Request identifies one command call.
type Request struct {
	// TenantID scopes the key: two tenants may use the same key.
	TenantID string
	// Key is the client's idempotency key (e.g. the Idempotency-Key header),
	// 1..255 bytes.
	Key string
	// Body is the caller's canonical encoding of the request. Its SHA-256 is
	// the fingerprint unless Fingerprint is set. Canonical means: the same
	// logical request always gives the same bytes (sorted keys, no
	// timestamps the client did not send).
	Body []byte
	// Fingerprint, when non-empty, is used as is instead of SHA-256(Body).
	Fingerprint []byte
}

func (r Request) fingerprint() []byte {
	if len(r.Fingerprint) > 0 {
		return r.Fingerprint
	}
	sum := sha256.Sum256(r.Body)
	return sum[:]
}

func (r Request) check() error {
	if r.Key == "" || len(r.Key) > MaxKeyBytes {
		return &RequestError{Field: "key", Reason: fmt.Sprintf("must be 1..%d bytes, got %d", MaxKeyBytes, len(r.Key))}
	}
	if len(r.TenantID) > MaxTenantBytes {
		return &RequestError{Field: "tenant_id", Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxTenantBytes, len(r.TenantID))}
	}
	if len(r.Fingerprint) > 64 {
		return &RequestError{Field: "fingerprint", Reason: fmt.Sprintf("must be at most 64 bytes, got %d", len(r.Fingerprint))}
	}
	return nil
}

// Result is what a command function returns for storage: a response body
// the caller will replay to retrying clients, and the ids of the events the
// command wrote (typically from outbox.Writer.InsertTx's return value).
type Result struct {
	Body     []byte
	EventIDs []uuid.UUID
}

// Outcome is the stored outcome of a command.
type Outcome struct {
	Result
	// Replayed is true when the command did not run in this call: the
	// outcome was stored by an earlier call with the same key.
	Replayed bool
	// CreatedAt is when the command first ran; ExpiresAt when the key will
	// be forgotten.
	CreatedAt, ExpiresAt time.Time
}

// Func is a command: it writes business rows and events in tx and returns
// what to store. An error rolls everything back (including the key record),
// so a retry runs it again.
type Func[TTx any] func(ctx context.Context, tx TTx) (Result, error)

// Runner runs commands idempotently. It is safe for concurrent use.
type Runner[TTx any] struct {
	drv driver.Driver[TTx]
	cfg config
	sql statements
}

type config struct {
	tables       ferry.Tables
	expiry       time.Duration
	replayWindow time.Duration
	now          func() time.Time
}

// Option configures a Runner.
type Option func(*config)

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) Option { return func(c *config) { c.tables = t } }

// WithExpiry sets how long a key is remembered (default 48h). A client that
// retries after the key expired runs the command again, so the expiry must
// cover the longest retry horizon of your clients — and it must be at least
// the replay window (see WithReplayWindow), or New fails.
func WithExpiry(d time.Duration) Option { return func(c *config) { c.expiry = d } }

// WithReplayWindow declares the deployment's replay window: how far back
// events and commands may be replayed or retried (the same figure the
// outbox/inbox cleanup honours). New refuses an expiry shorter than it,
// because a key forgotten before a replay re-runs the command.
func WithReplayWindow(d time.Duration) Option { return func(c *config) { c.replayWindow = d } }

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// New returns a Runner over drv.
func New[TTx any](drv driver.Driver[TTx], opts ...Option) (*Runner[TTx], error) {
	cfg := config{expiry: DefaultExpiry, now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.tables.Check(); err != nil {
		return nil, err
	}
	if cfg.expiry <= 0 {
		return nil, &ferry.ConfigError{Field: "command.expiry", Reason: fmt.Sprintf("must be positive, got %s", cfg.expiry)}
	}
	if cfg.replayWindow < 0 {
		return nil, &ferry.ConfigError{Field: "command.replay_window", Reason: fmt.Sprintf("must not be negative, got %s", cfg.replayWindow)}
	}
	if cfg.expiry < cfg.replayWindow {
		return nil, &ferry.ConfigError{Field: "command.expiry",
			Reason: fmt.Sprintf("expiry %s is shorter than the replay window %s; a key forgotten before a replay re-runs the command", cfg.expiry, cfg.replayWindow)}
	}
	switch drv.Dialect() {
	case driver.Postgres, driver.SQLite, driver.MySQL:
	default:
		return nil, &ferry.ConfigError{Field: "dialect", Reason: fmt.Sprintf("unsupported dialect %q", drv.Dialect())}
	}
	return &Runner[TTx]{drv: drv, cfg: cfg, sql: newStatements(cfg.tables, drv.Dialect())}, nil
}

// Run runs fn at most once per (req.TenantID, req.Key), in a transaction of
// its own that also records the key, the request fingerprint and fn's
// Result. If the key is already stored with the same fingerprint, fn does
// not run and the stored outcome is returned (Replayed = true); with another
// fingerprint the error is a *KeyReusedError. A concurrent call with the
// same key waits for the first to commit (Postgres: the unique index entry
// of the uncommitted row; SQLite: the write lock) and then replays its
// outcome; if the first fails, the waiter runs fn itself.
func (r *Runner[TTx]) Run(ctx context.Context, req Request, fn Func[TTx]) (Outcome, error) {
	if err := req.check(); err != nil {
		return Outcome{}, err
	}
	ttx, tx, err := r.drv.BeginTx(ctx)
	if err != nil {
		return Outcome{}, fmt.Errorf("command: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := r.run(ctx, tx, ttx, req, fn)
	if err != nil {
		return Outcome{}, err
	}
	if out.Replayed {
		return out, nil // nothing written; the deferred rollback ends the tx
	}
	if err := tx.Commit(ctx); err != nil {
		return Outcome{}, fmt.Errorf("command: commit key %q: %w", req.Key, err)
	}
	return out, nil
}

// RunTx is Run inside the caller's transaction tx: the key record commits or
// rolls back with it. If RunTx returns an error, roll tx back: the key row
// may have been written before fn failed. A replayed outcome writes nothing.
func (r *Runner[TTx]) RunTx(ctx context.Context, tx TTx, req Request, fn Func[TTx]) (Outcome, error) {
	if err := req.check(); err != nil {
		return Outcome{}, err
	}
	return r.run(ctx, r.drv.UnwrapExecutor(tx), tx, req, fn)
}

func (r *Runner[TTx]) run(ctx context.Context, exec driver.Executor, ttx TTx, req Request, fn Func[TTx]) (Outcome, error) {
	now := r.cfg.now().UTC()
	fp := req.fingerprint()
	// An expired key is forgotten: delete it so this call runs afresh.
	if _, err := exec.Exec(ctx, r.sql.deleteExpiredOne, req.TenantID, req.Key, now); err != nil {
		return Outcome{}, fmt.Errorf("command: forget expired key %q: %w", req.Key, err)
	}
	expires := now.Add(r.cfg.expiry)
	n, err := exec.Exec(ctx, r.sql.claim, req.TenantID, req.Key, fp, now, expires)
	if err != nil {
		return Outcome{}, fmt.Errorf("command: record key %q: %w", req.Key, err)
	}
	if n == 0 {
		return r.stored(ctx, exec, req, fp)
	}
	res, err := fn(ctx, ttx)
	if err != nil {
		return Outcome{}, err
	}
	if len(res.Body) > MaxResultBytes {
		return Outcome{}, &RequestError{Field: "result.body", Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxResultBytes, len(res.Body))}
	}
	if len(res.EventIDs) > MaxEventsPerCall {
		return Outcome{}, &RequestError{Field: "result.event_ids", Reason: fmt.Sprintf("at most %d, got %d", MaxEventsPerCall, len(res.EventIDs))}
	}
	body := res.Body
	if body == nil {
		body = []byte{}
	}
	if _, err := exec.Exec(ctx, r.sql.store, req.TenantID, req.Key, body, joinIDs(res.EventIDs)); err != nil {
		return Outcome{}, fmt.Errorf("command: store outcome of key %q: %w", req.Key, err)
	}
	return Outcome{Result: Result{Body: body, EventIDs: res.EventIDs}, CreatedAt: now, ExpiresAt: expires}, nil
}

func (r *Runner[TTx]) stored(ctx context.Context, exec driver.Executor, req Request, fp []byte) (Outcome, error) {
	rows, err := exec.Query(ctx, r.sql.load, req.TenantID, req.Key)
	if err != nil {
		return Outcome{}, fmt.Errorf("command: load key %q: %w", req.Key, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return Outcome{}, fmt.Errorf("command: load key %q: %w", req.Key, err)
		}
		// Deleted between our insert attempt and this read (cleanup raced
		// us): the caller may retry.
		return Outcome{}, fmt.Errorf("command: key %q vanished while being read; retry", req.Key)
	}
	var (
		storedFP []byte
		out      Outcome
		ids      string
	)
	if err := rows.Scan(&storedFP, &out.Body, &ids, &out.CreatedAt, &out.ExpiresAt); err != nil {
		return Outcome{}, fmt.Errorf("command: load key %q: %w", req.Key, err)
	}
	if string(storedFP) != string(fp) {
		return Outcome{}, &KeyReusedError{TenantID: req.TenantID, Key: req.Key}
	}
	out.EventIDs, err = splitIDs(ids)
	if err != nil {
		return Outcome{}, fmt.Errorf("command: load key %q: %w", req.Key, err)
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	out.Replayed = true
	return out, nil
}

// Cleanup deletes keys that expired before now, batch rows per statement,
// each batch in its own short transaction so it never holds many locks. It
// returns how many keys it deleted. batch must be in 1..10000.
func (r *Runner[TTx]) Cleanup(ctx context.Context, batch int) (int64, error) {
	if batch < 1 || batch > 10000 {
		return 0, &ferry.ConfigError{Field: "command.cleanup.batch", Reason: fmt.Sprintf("must be in 1..10000, got %d", batch)}
	}
	var total int64
	for {
		n, err := r.drv.Executor().Exec(ctx, r.sql.cleanup, r.cfg.now().UTC(), batch)
		if err != nil {
			return total, fmt.Errorf("command: cleanup: %w", err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

type statements struct {
	deleteExpiredOne, claim, store, load, cleanup string
}

func newStatements(t ferry.Tables, d driver.Dialect) statements {
	n := t.Name("command_keys")
	s := statements{
		deleteExpiredOne: fmt.Sprintf(`DELETE FROM %s WHERE tenant_id = $1 AND idem_key = $2 AND expires_at <= $3`, n),
		claim: fmt.Sprintf(`INSERT INTO %s (tenant_id, idem_key, fingerprint, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, idem_key) DO NOTHING`, n),
		store: fmt.Sprintf(`UPDATE %s SET result = $3, event_ids = $4 WHERE tenant_id = $1 AND idem_key = $2`, n),
		load:  fmt.Sprintf(`SELECT fingerprint, result, event_ids, created_at, expires_at FROM %s WHERE tenant_id = $1 AND idem_key = $2`, n),
	}
	switch d {
	case driver.Postgres:
		s.cleanup = fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid IN (SELECT ctid FROM %[1]s WHERE expires_at <= $1 LIMIT $2)`, n)
	case driver.MySQL:
		// MySQL 8 / MariaDB: no ON CONFLICT (a no-op ON DUPLICATE KEY
		// UPDATE reports 0 rows, as DO NOTHING does, and unlike INSERT
		// IGNORE keeps strict-mode errors), DELETE … LIMIT directly.
		s.claim = fmt.Sprintf(`INSERT INTO %s (tenant_id, idem_key, fingerprint, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5) ON DUPLICATE KEY UPDATE tenant_id = tenant_id`, n)
		s.cleanup = fmt.Sprintf(`DELETE FROM %s WHERE expires_at <= $1 LIMIT $2`, n)
	default:
		s.cleanup = fmt.Sprintf(`DELETE FROM %[1]s WHERE rowid IN (SELECT rowid FROM %[1]s WHERE expires_at <= $1 LIMIT $2)`, n)
	}
	return s
}

func joinIDs(ids []uuid.UUID) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id.String()
	}
	return strings.Join(parts, ",")
}

func splitIDs(s string) ([]uuid.UUID, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uuid.UUID, len(parts))
	for i, p := range parts {
		id, err := uuid.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("stored event id %d: %w", i, err)
		}
		out[i] = id
	}
	return out, nil
}
