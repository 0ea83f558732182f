package inbox

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry"
)

// PayloadOpener decrypts an event's payload; *encrypt.Codec implements it.
// An event it does not recognise as encrypted is returned unchanged. An
// error (wrong, unknown or erased key, tampered bytes) must not quote
// payload or key bytes.
type PayloadOpener interface {
	Open(ctx context.Context, ev ferry.Event) (ferry.Event, error)
}

// WithDecryption decrypts payloads sealed by the producer's
// outbox.WithEncryption before the contract check and the handler, which
// see the plaintext and its own content type. What the inbox stores —
// dedup fingerprint, parked rows — is computed from and keeps the
// envelope as delivered, so no plaintext copy lands in the consumer's
// tables. A message that does not decrypt (a wrong or missing keyring key,
// an erased subject, tampered bytes) still goes through the dedup claim
// and the cursor: a duplicate or stale one is absorbed as usual (dedup and
// order keep working after an erasure); one that would apply has its claim
// undone and is parked with reason decrypt, never dropped. It is
// replayable once the key is back (an erased subject's never is). With it the optimistic batch pass is off
// (each message runs under its own savepoint). Off by default.
func WithDecryption(o PayloadOpener) Option {
	return func(c *config) { c.opener = o; c.alwaysSavepoints = true }
}

// open fetches an offloaded payload (WithClaimCheck), then decrypts it
// (WithDecryption) for the handler — the producer encrypts, then
// offloads. ev unchanged without either; on failure the step kind says
// which one failed.
func (ib *Inbox[TTx]) open(ctx context.Context, ev ferry.Event) (ferry.Event, stepKind, error) {
	if ib.cfg.fetcher != nil {
		out, err := ib.cfg.fetcher.Open(ctx, ev)
		if err != nil {
			return ev, stepClaimCheck, fmt.Errorf("offloaded payload: %w", err)
		}
		ev = out
	}
	if ib.cfg.opener == nil {
		return ev, 0, nil
	}
	out, err := ib.cfg.opener.Open(ctx, ev)
	if err != nil {
		return ev, stepDecrypt, fmt.Errorf("payload does not decrypt: %w", err)
	}
	return out, 0, nil
}
