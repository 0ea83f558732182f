package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// plaintextSeen is a contract validator that records what it was shown.
type plaintextSeen struct{ payloads [][]byte }

func (p *plaintextSeen) Validate(_ string, _ int, payload []byte) error {
	p.payloads = append(p.payloads, bytes.Clone(payload))
	return nil
}

// WithEncryption on the producer: contracts see the plaintext, the row
// the envelope; an envelope over the payload limit is refused before
// anything is written; a rolled-back transaction leaves no subject key.
func TestWithEncryption(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		db, _ := testenv.NewSQLite(t)
		withEncryption(t, sqlite.New(db))
	})
	t.Run("postgres", func(t *testing.T) {
		s := testenv.NewPostgresSchema(t)
		withEncryption(t, pgxv5.New(s.Pool))
	})
}

func withEncryption[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	ring, err := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": bytes.Repeat([]byte{1}, encrypt.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	codec, err := encrypt.New(ring, encrypt.WithEventType("customer.updated", encrypt.Rule{Subject: encrypt.SubjectFromTarget}))
	if err != nil {
		t.Fatal(err)
	}
	seen := &plaintextSeen{}
	w, err := outbox.New(drv, outbox.WithEncryption(codec), outbox.WithContracts(seen))
	if err != nil {
		t.Fatal(err)
	}
	ev := func(target string, payload []byte) ferry.Event {
		return ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: "c-1", EventType: "customer.updated", SchemaVersion: 1,
			Payload: payload, Headers: ferry.Headers{Target: target}}
	}
	count := func(q string) int64 {
		t.Helper()
		var n int64
		if _, err := driver.QueryRow(ctx, drv.Executor(), q, nil, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	out, err := w.Insert(ctx, ev("customer/1", []byte(`{"name":"CANARY"}`)))
	if err != nil {
		t.Fatal(err)
	}
	if len(seen.payloads) != 1 || string(seen.payloads[0]) != `{"name":"CANARY"}` {
		t.Fatalf("contract saw %q, want the plaintext", seen.payloads)
	}
	if out[0].ContentType != encrypt.ContentType || bytes.Contains(out[0].Payload, []byte("CANARY")) {
		t.Fatalf("written event: %s, plaintext visible %t", out[0].ContentType, bytes.Contains(out[0].Payload, []byte("CANARY")))
	}

	// A plaintext at the limit does not fit once encrypted: refused, nothing written.
	_, err = w.Insert(ctx, ev("customer/2", bytes.Repeat([]byte("x"), ferry.DefaultMaxPayloadBytes)))
	if !errors.Is(err, ferry.ErrInvalidEvent) || !strings.Contains(err.Error(), "payload") || !strings.Contains(err.Error(), "encrypted") {
		t.Fatalf("oversized envelope: %v", err)
	}
	if n := count(`SELECT count(*) FROM ferry_outbox`); n != 1 {
		t.Fatalf("%d outbox rows after the refused call, want 1", n)
	}

	// The subject key is created in the producer's transaction: a rollback
	// leaves none (control: the commit above left one).
	txv, tx, err := drv.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, txv, ev("customer/3", []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM ferry_subject_keys`); n != 1 {
		t.Fatalf("%d subject keys after a rolled-back write, want 1 (customer/1's)", n)
	}
}
