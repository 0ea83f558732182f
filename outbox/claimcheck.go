package outbox

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry"
)

// PayloadOffloader moves large payloads out of the row (claim-check);
// *claimcheck.Store implements it. OffloadEvents writes each large
// payload to its blob store and replaces it with a reference, before the
// row is written (so before the transaction commits).
type PayloadOffloader interface {
	OffloadEvents(ctx context.Context, events []ferry.Event) error
	MaxDataBytes() int
}

// WithClaimCheck offloads payloads above the store's threshold (see
// package claimcheck). The payload limit of WithLimits then applies to
// what the row holds (the reference), while the data may be up to
// o.MaxDataBytes(). With WithEncryption too, the payload is encrypted
// first and the envelope offloaded. Off by default.
func WithClaimCheck(o PayloadOffloader) Option { return func(c *config) { c.offloader = o } }

// dataLimits are the limits the caller's payload is checked against.
func (w *Writer[TTx]) dataLimits() ferry.Limits {
	l := w.cfg.limits
	if w.cfg.offloader != nil {
		l.MaxPayloadBytes = w.cfg.offloader.MaxDataBytes()
	}
	return l
}

// offload runs the offloader and checks the rows against the limits.
func (w *Writer[TTx]) offload(ctx context.Context, events []ferry.Event) error {
	if err := w.cfg.offloader.OffloadEvents(ctx, events); err != nil {
		return fmt.Errorf("outbox: claim-check: %w", err)
	}
	for i := range events {
		e := events[i]
		if err := w.cfg.limits.Validate(i, &e); err != nil {
			return fmt.Errorf("outbox: event outside the limits after claim-check: %w", err)
		}
	}
	return nil
}
