package encrypt_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func TestRewrapSubjectKeysSQLite(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	rewrapScenario(t, sqlite.New(db))
}

func TestRewrapSubjectKeysPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	rewrapScenario(t, pgxv5.New(s.Pool))
}

// rewrapScenario: subject keys made under k1, k2 made current, rewrap;
// afterwards a keyring without k1 opens every old payload, an erased
// subject stays erased, and a second run changes nothing. Control: before
// the rewrap, the keyring without k1 cannot open them.
func rewrapScenario[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	k1 := ring(t, "k1", map[string][]byte{"k1": key(1)})
	k1k2 := ring(t, "k2", map[string][]byte{"k1": key(1), "k2": key(2)})
	k2 := ring(t, "k2", map[string][]byte{"k2": key(2)}) // k1 retired
	c, err := encrypt.New(k1, rules()...)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4), outbox.WithEncryption(c))
	if err != nil {
		t.Fatal(err)
	}
	evs := map[string]ferry.Event{}
	for _, sub := range []string{"c-1", "c-2", "c-3"} {
		out, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: sub, EventType: "customer.updated", SchemaVersion: 1, Payload: []byte(`{"n":"` + sub + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		evs[sub] = out[0]
	}
	sk, err := encrypt.NewSubjectKeys(ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := sk.EraseTx(ctx, drv.Executor(), "acme", "c-2", time.Now()); err != nil || n != 1 {
		t.Fatalf("erase c-2: %d %v", n, err)
	}
	openWith := func(r encrypt.Keyring, sub string) (ferry.Event, error) {
		t.Helper()
		cc, err := encrypt.New(r, append(rules(), encrypt.WithSubjectKeyStore(drv.Executor()))...)
		if err != nil {
			t.Fatal(err)
		}
		ev := evs[sub]
		var p []byte
		if _, err := driver.QueryRow(ctx, drv.Executor(), `SELECT payload FROM ferry_outbox WHERE event_id = $1`, []any{ev.ID.String()}, &p); err != nil {
			t.Fatal(err)
		}
		ev.Payload = p
		return cc.Open(ctx, ev)
	}
	// Control: without the rewrap, retiring k1 makes the payloads fail.
	for _, sub := range []string{"c-1", "c-3"} {
		if _, err := openWith(k2, sub); !errors.Is(err, encrypt.ErrUnknownKey) {
			t.Fatalf("control %s: err = %v, want ErrUnknownKey", sub, err)
		}
	}

	res, err := encrypt.RewrapSubjectKeys(ctx, drv, k1k2, ferry.Tables{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rewrapped != 2 || res.From["k1"] != 2 || res.Batches != 2 || res.To != "k2" {
		t.Fatalf("rewrap = %+v, want 2 rows from k1 to k2 in 2 batches", res)
	}
	for _, sub := range []string{"c-1", "c-3"} {
		keys, err := sk.Lookup(ctx, drv.Executor(), "acme", sub)
		if err != nil || len(keys) != 1 || keys[0].KEKID != "k2" {
			t.Fatalf("%s keys = %+v %v, want one under k2", sub, keys, err)
		}
		got, err := openWith(k2, sub)
		if err != nil || !bytes.Equal(got.Payload, []byte(`{"n":"`+sub+`"}`)) {
			t.Fatalf("%s after rewrap with k1 retired: %q %v", sub, got.Payload, err)
		}
	}
	// The erased subject stays erased: no key came back.
	if keys, err := sk.Lookup(ctx, drv.Executor(), "acme", "c-2"); err != nil || len(keys) != 1 || keys[0].ErasedAt == nil || keys[0].KEKID != "" {
		t.Fatalf("c-2 keys = %+v %v, want one erased", keys, err)
	}
	for _, r := range []encrypt.Keyring{k2, k1k2} {
		if _, err := openWith(r, "c-2"); !errors.Is(err, encrypt.ErrSubjectErased) {
			t.Fatalf("erased c-2 opened: err = %v", err)
		}
	}
	// Idempotent.
	if res, err := encrypt.RewrapSubjectKeys(ctx, drv, k1k2, ferry.Tables{}, 1); err != nil || res.Rewrapped != 0 || res.Batches != 0 {
		t.Fatalf("second rewrap = %+v %v, want nothing to do", res, err)
	}
	// A keyring that lacks the old KEK stops with ErrUnknownKey and changes nothing.
	if res, err := encrypt.RewrapSubjectKeys(ctx, drv, ring(t, "k3", map[string][]byte{"k3": key(3)}), ferry.Tables{}, 10); !errors.Is(err, encrypt.ErrUnknownKey) || res.Rewrapped != 0 {
		t.Fatalf("rewrap without k2: %+v %v, want ErrUnknownKey", res, err)
	}
}
