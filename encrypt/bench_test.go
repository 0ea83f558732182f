package encrypt_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/encrypt"
)

// BenchmarkSealOpen is the CPU cost of the envelope alone (no database):
// sealing and opening one 512-byte payload with a fresh data key wrapped by
// the local keyring. The producer's end-to-end cost against the plain path
// is outbox's BenchmarkInsertEncrypted.
//
//	go test -run '^$' -bench BenchmarkSealOpen ./encrypt/
func BenchmarkSealOpen(b *testing.B) {
	ctx := context.Background()
	c, err := encrypt.New(mustRing(), encrypt.WithEventType("order.created", encrypt.Rule{}))
	if err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), 512)
	ev := ferry.Event{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: payload}
	b.Run("seal", func(b *testing.B) {
		evs := make([]ferry.Event, 1)
		b.ReportAllocs()
		for range b.N {
			evs[0] = ev
			if err := c.SealEvents(ctx, nil, evs); err != nil {
				b.Fatal(err)
			}
		}
	})
	evs := []ferry.Event{ev}
	if err := c.SealEvents(ctx, nil, evs); err != nil {
		b.Fatal(err)
	}
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := c.Open(ctx, evs[0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
