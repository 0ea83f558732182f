package encrypt

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// DefaultRewrapBatch is how many subject keys RewrapSubjectKeys changes per transaction.
const DefaultRewrapBatch = 500

// RewrapDB is what RewrapSubjectKeys needs of a store: each batch is its
// own short transaction.
type RewrapDB interface {
	Begin(ctx context.Context) (driver.Tx, error)
}

// RewrapResult counts what RewrapSubjectKeys did, by the KEK each key was
// wrapped under before.
type RewrapResult struct {
	To        string           `json:"to"`        // the keyring's current key id
	Rewrapped int64            `json:"rewrapped"` // rows now wrapped under To
	From      map[string]int64 `json:"from"`      // old KEK id → rows moved off it
	Batches   int              `json:"batches"`
}

// RewrapSubjectKeys re-wraps every live subject key wrapped under a KEK
// other than ring's current one: it unwraps the data key with the old KEK
// and wraps the same bytes under the current KEK, updating the row in place
// (same handle, same data key), so every payload sealed under the subject
// key still opens and the old KEK can be retired from the keyring
// afterwards. Erased keys (no wrapped key) are never touched, and an
// update only applies while the row is still live and still names the old
// KEK, so a concurrent erase wins. It works in batches of batch rows
// (<= 0: DefaultRewrapBatch), each its own transaction, and is idempotent:
// a second run finds nothing to do. A key the keyring cannot unwrap stops
// the run with the error (rows of earlier batches stay re-wrapped).
//
// Per-event data keys (ModeEvent envelopes) are wrapped inside the
// payload, not in this table: they are not re-wrapped here.
func RewrapSubjectKeys(ctx context.Context, db RewrapDB, ring Keyring, t ferry.Tables, batch int) (RewrapResult, error) {
	if err := t.Check(); err != nil {
		return RewrapResult{}, err
	}
	if ring == nil || !ValidKeyID(ring.CurrentKeyID()) {
		return RewrapResult{}, &ferry.ConfigError{Field: "encrypt.keyring", Reason: "needs a current key id"}
	}
	if batch <= 0 {
		batch = DefaultRewrapBatch
	}
	n := t.Name("subject_keys")
	to := ring.CurrentKeyID()
	sel := fmt.Sprintf(`SELECT key_id, tenant_id, kek_id, wrapped_key FROM %s
WHERE erased_at IS NULL AND wrapped_key IS NOT NULL AND kek_id <> $1 AND key_id > $2 ORDER BY key_id LIMIT %d`, n, batch)
	upd := fmt.Sprintf(`UPDATE %s SET kek_id = $1, wrapped_key = $2
WHERE key_id = $3 AND kek_id = $4 AND erased_at IS NULL AND wrapped_key IS NOT NULL`, n)
	res := RewrapResult{To: to, From: map[string]int64{}}
	after := ""
	for {
		tx, err := db.Begin(ctx)
		if err != nil {
			return res, fmt.Errorf("encrypt: rewrap: begin: %w", err)
		}
		moved, last, count, err := rewrapBatch(ctx, tx, ring, sel, upd, to, after)
		if err != nil {
			_ = tx.Rollback(ctx)
			return res, err
		}
		if err := tx.Commit(ctx); err != nil {
			return res, fmt.Errorf("encrypt: rewrap: commit: %w", err)
		}
		if count == 0 {
			return res, nil
		}
		res.Batches++
		for k, v := range moved {
			res.From[k] += v
			res.Rewrapped += v
		}
		after = last
		if count < batch {
			return res, nil
		}
	}
}

type rewrapRow struct {
	handle, tenant, kek string
	wrapped             []byte
}

func rewrapBatch(ctx context.Context, tx driver.Tx, ring Keyring, sel, upd, to, after string) (map[string]int64, string, int, error) {
	rows, err := tx.Query(ctx, sel, to, after)
	if err != nil {
		return nil, "", 0, fmt.Errorf("encrypt: rewrap: read subject keys: %w", err)
	}
	var rs []rewrapRow
	for rows.Next() {
		var r rewrapRow
		if err := rows.Scan(&r.handle, &r.tenant, &r.kek, &r.wrapped); err != nil {
			rows.Close()
			return nil, "", 0, fmt.Errorf("encrypt: rewrap: read subject keys: %w", err)
		}
		rs = append(rs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, "", 0, fmt.Errorf("encrypt: rewrap: read subject keys: %w", err)
	}
	moved := map[string]int64{}
	last := after
	for _, r := range rs {
		last = r.handle
		aad := subjectKeyAAD(r.handle, r.tenant)
		dek, err := ring.Unwrap(ctx, r.kek, r.wrapped, aad)
		if err != nil {
			return nil, "", 0, fmt.Errorf("encrypt: rewrap: subject key %s (kek %s): %w", r.handle, r.kek, err)
		}
		w, err := ring.Wrap(ctx, to, dek, aad)
		if err != nil {
			return nil, "", 0, fmt.Errorf("encrypt: rewrap: subject key %s: wrap under %s: %w", r.handle, to, err)
		}
		n, err := tx.Exec(ctx, upd, to, w, r.handle, r.kek)
		if err != nil {
			return nil, "", 0, fmt.Errorf("encrypt: rewrap: update subject key %s: %w", r.handle, err)
		}
		moved[r.kek] += n
	}
	return moved, last, len(rs), nil
}

// PendingRewrap counts the live subject keys RewrapSubjectKeys would
// re-wrap to current, by the KEK id they are wrapped under now.
func PendingRewrap(ctx context.Context, exec driver.Executor, t ferry.Tables, current string) (map[string]int64, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT kek_id, COUNT(*) FROM %s
WHERE erased_at IS NULL AND wrapped_key IS NOT NULL AND kek_id <> $1 GROUP BY kek_id ORDER BY kek_id`, t.Name("subject_keys")), current)
	if err != nil {
		return nil, fmt.Errorf("encrypt: count subject keys to rewrap: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("encrypt: count subject keys to rewrap: %w", err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("encrypt: count subject keys to rewrap: %w", err)
	}
	return out, nil
}
