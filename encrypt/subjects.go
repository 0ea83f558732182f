package encrypt

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// ErrNoSubjectKey: no live key exists for the (tenant, subject).
var ErrNoSubjectKey = errors.New("encrypt: no key for this subject")

// SubjectKey describes one row of the subject_keys table, without the key.
type SubjectKey struct {
	// Handle is the opaque id the envelopes carry (never the subject).
	Handle   string `json:"handle"`
	TenantID string `json:"tenant_id"`
	// SubjectDigest is hex SHA-256 of tenant, NUL, subject: how an erased
	// subject is recognised without keeping its name.
	SubjectDigest string     `json:"subject_digest"`
	KEKID         string     `json:"kek_id"` // the keyring key that wraps it; empty once erased
	CreatedAt     time.Time  `json:"created_at"`
	ErasedAt      *time.Time `json:"erased_at,omitempty"`
}

// SubjectDigest is hex SHA-256 of tenant, NUL, subject.
func SubjectDigest(tenant, subject string) string {
	s := sha256.Sum256([]byte(tenant + "\x00" + subject))
	return hex.EncodeToString(s[:])
}

type subjectSQL struct {
	byName, byHandle, insert, insertMySQL, erase, eraseMySQL, byDigest string
}

func newSubjectSQL(t ferry.Tables) subjectSQL {
	n := t.Name("subject_keys")
	cols := `key_id, tenant_id, subject_digest, kek_id, wrapped_key, created_at, erased_at`
	return subjectSQL{
		byName:   fmt.Sprintf(`SELECT %s FROM %s WHERE tenant_id = $1 AND subject = $2`, cols, n),
		byHandle: fmt.Sprintf(`SELECT %s FROM %s WHERE key_id = $1`, cols, n),
		byDigest: fmt.Sprintf(`SELECT %s FROM %s WHERE tenant_id = $1 AND subject_digest = $2 ORDER BY created_at, key_id LIMIT 100`, cols, n),
		insert: fmt.Sprintf(`INSERT INTO %s (key_id, tenant_id, subject, subject_digest, kek_id, wrapped_key, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, subject) DO NOTHING`, n),
		insertMySQL: fmt.Sprintf(`INSERT IGNORE INTO %s (key_id, tenant_id, subject, subject_digest, kek_id, wrapped_key, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, n),
		// The subject's name is replaced by a tombstone naming the handle,
		// so the row keeps the evidence (when, which handle) but neither
		// the key nor the name.
		erase: fmt.Sprintf(`UPDATE %s SET wrapped_key = NULL, kek_id = '', subject = 'erased:' || key_id, erased_at = $3
WHERE tenant_id = $1 AND subject = $2 AND erased_at IS NULL`, n),
		eraseMySQL: fmt.Sprintf(`UPDATE %s SET wrapped_key = NULL, kek_id = '', subject = CONCAT('erased:', key_id), erased_at = $3
WHERE tenant_id = $1 AND subject = $2 AND erased_at IS NULL`, n),
	}
}

type subjectKey struct {
	handle string
	dek    []byte
}

type subjectRow struct {
	SubjectKey
	wrapped []byte
}

func scanSubject(ctx context.Context, exec driver.Executor, q string, args ...any) (subjectRow, bool, error) {
	var r subjectRow
	found, err := driver.QueryRow(ctx, exec, q, args, &r.Handle, &r.TenantID, &r.SubjectDigest, &r.KEKID, &r.wrapped, &r.CreatedAt, &r.ErasedAt)
	if err != nil {
		return r, false, fmt.Errorf("encrypt: read subject key: %w", err)
	}
	r.CreatedAt = r.CreatedAt.UTC()
	return r, found, nil
}

func subjectKeyAAD(handle, tenant string) []byte {
	return []byte("ferry-subject-key\x00" + handle + "\x00" + tenant)
}

// subjectKeyFor returns the live key of (tenant, subject), creating it in
// exec (the producer's transaction) when there is none: a rolled-back
// transaction leaves no key behind, and concurrent producers agree on one
// key through the table's unique (tenant_id, subject).
func (c *Codec) subjectKeyFor(ctx context.Context, exec driver.Executor, tenant, subject string) (subjectKey, error) {
	r, found, err := scanSubject(ctx, exec, c.sk.byName, tenant, subject)
	if err != nil {
		return subjectKey{}, err
	}
	if !found {
		raw := make([]byte, 16)
		dek := make([]byte, KeySize)
		if _, err := rand.Read(raw); err != nil {
			return subjectKey{}, fmt.Errorf("encrypt: random handle: %w", err)
		}
		if _, err := rand.Read(dek); err != nil {
			return subjectKey{}, fmt.Errorf("encrypt: random data key: %w", err)
		}
		handle := "sk-" + hex.EncodeToString(raw)
		kid := c.ring.CurrentKeyID()
		wrapped, err := c.ring.Wrap(ctx, kid, dek, subjectKeyAAD(handle, tenant))
		if err != nil {
			return subjectKey{}, fmt.Errorf("encrypt: wrap subject key: %w", err)
		}
		q := c.sk.insert
		if exec.Dialect() == driver.MySQL {
			q = c.sk.insertMySQL
		}
		if _, err := exec.Exec(ctx, q, handle, tenant, subject, SubjectDigest(tenant, subject), kid, wrapped, c.now().UTC()); err != nil {
			return subjectKey{}, fmt.Errorf("encrypt: create subject key: %w", err)
		}
		// Read back: a concurrent producer may have created it first.
		if r, found, err = scanSubject(ctx, exec, c.sk.byName, tenant, subject); err != nil {
			return subjectKey{}, err
		}
		if !found {
			return subjectKey{}, fmt.Errorf("encrypt: subject key not visible after insert (isolation above READ COMMITTED?)")
		}
	}
	dek, err := c.unwrapRow(ctx, r)
	if err != nil {
		return subjectKey{}, err
	}
	return subjectKey{handle: r.Handle, dek: dek}, nil
}

// unwrapSubjectKey reads the subject key with handle from exec.
func (c *Codec) unwrapSubjectKey(ctx context.Context, exec driver.Executor, tenant, handle string) ([]byte, error) {
	r, found, err := scanSubject(ctx, exec, c.sk.byHandle, handle)
	if err != nil {
		return nil, err
	}
	if !found || r.TenantID != tenant {
		return nil, fmt.Errorf("%w: subject key %s not found", ErrUnknownKey, handle)
	}
	return c.unwrapRow(ctx, r)
}

func (c *Codec) unwrapRow(ctx context.Context, r subjectRow) ([]byte, error) {
	if r.ErasedAt != nil || len(r.wrapped) == 0 {
		return nil, fmt.Errorf("%w: subject key %s", ErrSubjectErased, r.Handle)
	}
	dek, err := c.ring.Unwrap(ctx, r.KEKID, r.wrapped, subjectKeyAAD(r.Handle, r.TenantID))
	if err != nil {
		return nil, fmt.Errorf("subject key %s: %w", r.Handle, err)
	}
	return dek, nil
}

// SubjectKeys reads and erases subject keys; the Go API under `ferry erase`.
type SubjectKeys struct{ sk subjectSQL }

// NewSubjectKeys returns SubjectKeys over the tables' subject_keys table.
func NewSubjectKeys(t ferry.Tables) (*SubjectKeys, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	return &SubjectKeys{sk: newSubjectSQL(t)}, nil
}

// Lookup returns the live key of (tenant, subject) and any erased ones
// (recognised by digest), oldest first. No rows: ErrNoSubjectKey.
func (s *SubjectKeys) Lookup(ctx context.Context, exec driver.Executor, tenant, subject string) ([]SubjectKey, error) {
	if err := checkSubject(subject); err != nil {
		return nil, &ferry.ValidationError{Field: "subject", Reason: err.Error()}
	}
	rows, err := exec.Query(ctx, s.sk.byDigest, tenant, SubjectDigest(tenant, subject))
	if err != nil {
		return nil, fmt.Errorf("encrypt: read subject keys: %w", err)
	}
	defer rows.Close()
	var out []SubjectKey
	for rows.Next() {
		var r subjectRow
		if err := rows.Scan(&r.Handle, &r.TenantID, &r.SubjectDigest, &r.KEKID, &r.wrapped, &r.CreatedAt, &r.ErasedAt); err != nil {
			return nil, fmt.Errorf("encrypt: read subject keys: %w", err)
		}
		r.CreatedAt = r.CreatedAt.UTC()
		if r.ErasedAt != nil {
			t := r.ErasedAt.UTC()
			r.ErasedAt = &t
		}
		out = append(out, r.SubjectKey)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("encrypt: read subject keys: %w", err)
	}
	if len(out) == 0 {
		return nil, ErrNoSubjectKey
	}
	return out, nil
}

// EraseTx destroys the live key of (tenant, subject) in exec, the
// caller's transaction: the wrapped key and the subject's name are
// removed, the row (handle, digest, times) stays as evidence. It returns
// how many keys it destroyed (0 or 1). Every payload sealed under the key
// — outbox rows, broker copies, archives — is unreadable afterwards.
func (s *SubjectKeys) EraseTx(ctx context.Context, exec driver.Executor, tenant, subject string, now time.Time) (int64, error) {
	if err := checkSubject(subject); err != nil {
		return 0, &ferry.ValidationError{Field: "subject", Reason: err.Error()}
	}
	q := s.sk.erase
	if exec.Dialect() == driver.MySQL {
		q = s.sk.eraseMySQL
	}
	n, err := exec.Exec(ctx, q, tenant, subject, now.UTC())
	if err != nil {
		return 0, fmt.Errorf("encrypt: erase subject key: %w", err)
	}
	return n, nil
}
