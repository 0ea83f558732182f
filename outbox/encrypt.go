package outbox

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// PayloadSealer encrypts the payloads of a call's events in place, inside
// the producer's transaction (exec), after validation and before anything
// is written; *encrypt.Codec implements it. Events whose type it does not
// encrypt are left as they are. Errors must not quote payloads or keys.
type PayloadSealer interface {
	SealEvents(ctx context.Context, exec driver.Executor, events []ferry.Event) error
}

// WithEncryption seals payloads with s (see package encrypt and
// docs/ENCRYPTION.md): per event type, envelope encryption with AES-GCM
// data keys wrapped by a keyring, optionally one data key per data subject
// so that `ferry erase` can crypto-shred a subject's every copy.
// Validation and contracts (WithContracts) see the plaintext; the row,
// the broker and every later copy hold the envelope, whose content type
// is encrypt.ContentType. The envelope must still fit the limits
// (WithLimits): the ciphertext adds about 100 bytes, and the content
// types accepted must include encrypt.ContentType (the defaults do).
// Off by default.
//
// On SQLite and MySQL a subject's first event creates its key row before
// the call's savepoint: a call that then fails leaves that key row (never
// an event) in the transaction.
func WithEncryption(s PayloadSealer) Option { return func(c *config) { c.sealer = s } }

// seal runs the sealer over events (normalised, ids assigned) and checks
// the envelopes against the limits.
func (w *Writer[TTx]) seal(ctx context.Context, exec driver.Executor, events []ferry.Event) error {
	if err := w.cfg.sealer.SealEvents(ctx, exec, events); err != nil {
		return fmt.Errorf("outbox: encrypt: %w", err)
	}
	for i := range events {
		e := events[i]
		if err := w.dataLimits().Validate(i, &e); err != nil {
			return fmt.Errorf("outbox: encrypted event outside the limits (the envelope is larger than the plaintext and has its own content type): %w", err)
		}
	}
	return nil
}
