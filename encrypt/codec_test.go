package encrypt_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/encrypt"
)

const canary = "CANARY-4111111111111111"

func sealedEvent(t *testing.T, c *encrypt.Codec) ferry.Event {
	t.Helper()
	ev := ferry.Event{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created",
		SchemaVersion: 1, ContentType: "application/json", Payload: []byte(`{"card":"` + canary + `"}`)}
	evs := []ferry.Event{ev}
	if err := c.SealEvents(context.Background(), nil, evs); err != nil {
		t.Fatal(err)
	}
	return evs[0]
}

func ring(t *testing.T, current string, keys map[string][]byte) *encrypt.LocalKeyring {
	t.Helper()
	k, err := encrypt.NewLocalKeyring(current, keys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func codec(t *testing.T, k encrypt.Keyring) *encrypt.Codec {
	t.Helper()
	c, err := encrypt.New(k, encrypt.WithEventType("order.created", encrypt.Rule{}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSealOpenRoundTripAndTruthfulContentType(t *testing.T) {
	c := codec(t, ring(t, "k1", map[string][]byte{"k1": key(1)}))
	ev := sealedEvent(t, c)
	if ev.ContentType != encrypt.ContentType || bytes.Contains(ev.Payload, []byte(canary)) {
		t.Fatalf("sealed: content type %q, plaintext visible %t", ev.ContentType, bytes.Contains(ev.Payload, []byte(canary)))
	}
	h, err := encrypt.Inspect(ev.Payload)
	if err != nil || h.Mode != encrypt.ModeEvent || h.KeyID != "k1" || h.ContentType != "application/json" {
		t.Fatalf("inspect %+v %v", h, err)
	}
	got, err := c.Open(context.Background(), ev)
	if err != nil || string(got.Payload) != `{"card":"`+canary+`"}` || got.ContentType != "application/json" {
		t.Fatalf("open: %q %q %v", got.Payload, got.ContentType, err)
	}
	// Events of types without a rule pass in clear both ways.
	plain := []ferry.Event{{ID: uuid.Must(uuid.NewV7()), EventType: "order.shipped", Payload: []byte("x"), ContentType: "text/plain"}}
	if err := c.SealEvents(context.Background(), nil, plain); err != nil || string(plain[0].Payload) != "x" {
		t.Fatalf("unruled type sealed: %q %v", plain[0].Payload, err)
	}
}

func TestRotationOldAndNewKeysLive(t *testing.T) {
	ctx := context.Background()
	old := sealedEvent(t, codec(t, ring(t, "k1", map[string][]byte{"k1": key(1)})))
	// Rotate: k2 is current, k1 stays for what it wrapped. No row is rewritten.
	rotated := codec(t, ring(t, "k2", map[string][]byte{"k1": key(1), "k2": key(2)}))
	fresh := sealedEvent(t, rotated)
	if h, _ := encrypt.Inspect(fresh.Payload); h.KeyID != "k2" {
		t.Fatalf("new event wrapped under %q, want k2", h.KeyID)
	}
	for name, ev := range map[string]ferry.Event{"old (k1)": old, "new (k2)": fresh} {
		if got, err := rotated.Open(ctx, ev); err != nil || !bytes.Contains(got.Payload, []byte(canary)) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Negative control: retire k1 and the old event no longer opens.
	retired := codec(t, ring(t, "k2", map[string][]byte{"k2": key(2)}))
	if _, err := retired.Open(ctx, old); !errors.Is(err, encrypt.ErrUnknownKey) {
		t.Fatalf("k1 retired: %v, want ErrUnknownKey", err)
	}
}

func TestWrongKeyAndTamperingFail(t *testing.T) {
	ctx := context.Background()
	ev := sealedEvent(t, codec(t, ring(t, "k1", map[string][]byte{"k1": key(1)})))
	wrong := codec(t, ring(t, "k1", map[string][]byte{"k1": key(3)})) // same id, other bytes
	if _, err := wrong.Open(ctx, ev); !errors.Is(err, encrypt.ErrDecrypt) || strings.Contains(err.Error(), canary) {
		t.Fatalf("wrong key: %v, want ErrDecrypt", err)
	}
	right := codec(t, ring(t, "k1", map[string][]byte{"k1": key(1)}))
	flipped := ev
	flipped.Payload = bytes.Clone(ev.Payload)
	flipped.Payload[len(flipped.Payload)-1] ^= 1
	if _, err := right.Open(ctx, flipped); !errors.Is(err, encrypt.ErrDecrypt) {
		t.Fatalf("tampered: %v, want ErrDecrypt", err)
	}
	moved := ev
	moved.ID = uuid.Must(uuid.NewV7()) // the payload copied onto another event
	if _, err := right.Open(ctx, moved); !errors.Is(err, encrypt.ErrDecrypt) {
		t.Fatalf("moved to another event: %v, want ErrDecrypt", err)
	}
	garbage := ev
	garbage.Payload = []byte("FRYE\x01\x01")
	if _, err := right.Open(ctx, garbage); !errors.Is(err, encrypt.ErrMalformed) {
		t.Fatalf("truncated: %v, want ErrMalformed", err)
	}
	if got, err := right.Open(ctx, ev); err != nil || !bytes.Contains(got.Payload, []byte(canary)) {
		t.Fatalf("control: the right key opens it: %v", err)
	}
}

func TestSubjectRuleRefusesEventsWithoutSubject(t *testing.T) {
	c, err := encrypt.New(ring(t, "k1", map[string][]byte{"k1": key(1)}),
		encrypt.WithEventType("customer.updated", encrypt.Rule{Subject: encrypt.SubjectFromTarget}))
	if err != nil {
		t.Fatal(err)
	}
	evs := []ferry.Event{{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", EventType: "customer.updated", Payload: []byte(canary)}}
	err = c.SealEvents(context.Background(), nil, evs)
	var ve *ferry.ValidationError
	if !errors.As(err, &ve) || ve.Field != "subject" {
		t.Fatalf("err = %v, want a validation error on subject", err)
	}
}

// FuzzInspect drives arbitrary bytes through the envelope decoder: it
// never panics, and whatever it accepts re-encodes to the same header.
func FuzzInspect(f *testing.F) {
	c, err := encrypt.New(mustRing(), encrypt.WithEventType("t", encrypt.Rule{}))
	if err != nil {
		f.Fatal(err)
	}
	evs := []ferry.Event{{ID: uuid.Must(uuid.NewV7()), TenantID: "x", EventType: "t", Payload: []byte("hello")}}
	if err := c.SealEvents(context.Background(), nil, evs); err != nil {
		f.Fatal(err)
	}
	f.Add(evs[0].Payload)
	f.Add([]byte("FRYE\x01\x02\x05sk-ab\x10application/json" + strings.Repeat("n", 28)))
	f.Add([]byte("FRYE\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := encrypt.Inspect(b)
		if err != nil {
			if !errors.Is(err, encrypt.ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if !encrypt.ValidKeyID(h.KeyID) || h.ContentType == "" || (h.Mode == encrypt.ModeEvent) != (len(h.WrappedKey) > 0) {
			t.Fatalf("accepted an invalid header %+v", h)
		}
		ev := ferry.Event{ID: uuid.Must(uuid.NewV7()), ContentType: encrypt.ContentType, Payload: b}
		if _, err := c.Open(context.Background(), ev); err == nil {
			t.Fatalf("random bytes opened")
		}
	})
}

func mustRing() *encrypt.LocalKeyring {
	k, err := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": key(1)})
	if err != nil {
		panic(err)
	}
	return k
}
