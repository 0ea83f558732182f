package encrypt

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// Rule is how one event type is encrypted.
type Rule struct {
	// Subject names the data subject the event is about (a customer id,
	// say), read from the event: its payload is then encrypted under that
	// subject's data key, which `ferry erase` destroys. Nil: a fresh data
	// key per event, wrapped by the keyring (no erasure by subject).
	// Returning "" or an error refuses the write: an event type declared
	// per-subject never leaves the producer unerasable.
	Subject func(ev ferry.Event) (string, error)
}

// SubjectFromTarget is a Rule.Subject reading Headers.Target ("customer/42").
func SubjectFromTarget(ev ferry.Event) (string, error) { return ev.Headers.Target, nil }

// Codec seals payloads on the producer (outbox.WithEncryption) and opens
// them in the consumer (inbox.WithDecryption). It is safe for concurrent
// use and holds no state between calls: subject keys are read from the
// table every time, so an erasure takes effect at once everywhere.
type Codec struct {
	ring   Keyring
	rules  map[string]Rule
	tables ferry.Tables
	store  driver.Executor // where Open reads subject keys; nil: none
	now    func() time.Time
	sk     subjectSQL
}

// Option configures a Codec.
type Option func(*Codec)

// WithEventType encrypts events of eventType by rule. Event types not
// named pass through in clear.
func WithEventType(eventType string, rule Rule) Option {
	return func(c *Codec) { c.rules[eventType] = rule }
}

// WithTables sets the schema and table prefix of the subject_keys table.
func WithTables(t ferry.Tables) Option { return func(c *Codec) { c.tables = t } }

// WithSubjectKeyStore is where Open reads subject keys: the producer's
// database (the consumer needs read access to its subject_keys table).
// Seal uses the producer's transaction instead.
func WithSubjectKeyStore(exec driver.Executor) Option { return func(c *Codec) { c.store = exec } }

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option { return func(c *Codec) { c.now = now } }

// New returns a Codec over ring.
func New(ring Keyring, opts ...Option) (*Codec, error) {
	if ring == nil {
		return nil, &ferry.ConfigError{Field: "encrypt.keyring", Reason: "must not be nil"}
	}
	c := &Codec{ring: ring, rules: map[string]Rule{}, now: time.Now}
	for _, o := range opts {
		o(c)
	}
	if err := c.tables.Check(); err != nil {
		return nil, err
	}
	if !ValidKeyID(ring.CurrentKeyID()) {
		return nil, &ferry.ConfigError{Field: "encrypt.keyring", Reason: "current key id must be 1..64 bytes of [A-Za-z0-9._-]"}
	}
	for et := range c.rules {
		if et == "" {
			return nil, &ferry.ConfigError{Field: "encrypt.event_type", Reason: "must not be empty"}
		}
	}
	c.sk = newSubjectSQL(c.tables)
	return c, nil
}

// Encrypts reports whether events of eventType are sealed.
func (c *Codec) Encrypts(eventType string) bool { _, ok := c.rules[eventType]; return ok }

// MaxSubjectBytes bounds a subject name.
const MaxSubjectBytes = 200

// SealEvents encrypts, in place, the payload of every event whose type has
// a rule, using exec (the producer's transaction) to find or create
// subject keys. Events must have their ID assigned. On error nothing is
// promised about events; the caller discards them.
func (c *Codec) SealEvents(ctx context.Context, exec driver.Executor, events []ferry.Event) error {
	var keys map[[2]string]subjectKey // per call: one lookup per subject
	for i := range events {
		e := &events[i]
		rule, ok := c.rules[e.EventType]
		if !ok {
			continue
		}
		if e.ContentType == ContentType {
			return &ferry.ValidationError{Index: i, Field: "content_type", Reason: "already a Ferry envelope: the payload would be encrypted twice"}
		}
		ct := e.ContentType
		if ct == "" {
			ct = ferry.DefaultContentType
		}
		var h Header
		var dek []byte
		if rule.Subject == nil {
			dek = make([]byte, KeySize)
			if _, err := rand.Read(dek); err != nil {
				return fmt.Errorf("encrypt: random data key: %w", err)
			}
			kid := c.ring.CurrentKeyID()
			wrapped, err := c.ring.Wrap(ctx, kid, dek, eventKeyAAD(e))
			if err != nil {
				return fmt.Errorf("encrypt: event[%d]: wrap data key: %w", i, err)
			}
			h = Header{Mode: ModeEvent, KeyID: kid, ContentType: ct, WrappedKey: wrapped}
		} else {
			subject, err := rule.Subject(*e)
			if err != nil {
				return fmt.Errorf("encrypt: event[%d]: subject: %w", i, err)
			}
			if err := checkSubject(subject); err != nil {
				return &ferry.ValidationError{Index: i, Field: "subject", Reason: err.Error()}
			}
			if keys == nil {
				keys = map[[2]string]subjectKey{}
			}
			k, ok := keys[[2]string{e.TenantID, subject}]
			if !ok {
				if k, err = c.subjectKeyFor(ctx, exec, e.TenantID, subject); err != nil {
					return fmt.Errorf("encrypt: event[%d]: %w", i, err)
				}
				keys[[2]string{e.TenantID, subject}] = k
			}
			dek = k.dek
			h = Header{Mode: ModeSubject, KeyID: k.handle, ContentType: ct}
		}
		out, err := appendHeader(make([]byte, 0, 64+len(h.WrappedKey)+nonceSize+len(e.Payload)+tagSize), h)
		if err != nil {
			return fmt.Errorf("encrypt: event[%d]: %w", i, err)
		}
		aead, err := newAEAD(dek)
		if err != nil {
			return fmt.Errorf("encrypt: event[%d]: %w", i, err)
		}
		sealed, err := seal(aead, e.Payload, payloadAAD(out, e))
		if err != nil {
			return err
		}
		e.Payload = append(out, sealed...)
		e.ContentType = ContentType
	}
	return nil
}

// Open returns ev with its payload decrypted and its content type
// restored. An event that is not a Ferry envelope (another content type)
// is returned unchanged. Errors match ErrMalformed, ErrUnknownKey,
// ErrSubjectErased or ErrDecrypt and never quote payload or key bytes.
func (c *Codec) Open(ctx context.Context, ev ferry.Event) (ferry.Event, error) {
	if ev.ContentType != ContentType {
		return ev, nil
	}
	h, hb, nonce, sealed, err := parse(ev.Payload)
	if err != nil {
		return ev, err
	}
	var dek []byte
	switch h.Mode {
	case ModeEvent:
		if dek, err = c.ring.Unwrap(ctx, h.KeyID, h.WrappedKey, eventKeyAAD(&ev)); err != nil {
			return ev, fmt.Errorf("encrypt: event %s: %w", ev.ID, err)
		}
	case ModeSubject:
		if c.store == nil {
			return ev, fmt.Errorf("%w: subject key %s: no subject key store configured (encrypt.WithSubjectKeyStore)", ErrUnknownKey, h.KeyID)
		}
		if dek, err = c.unwrapSubjectKey(ctx, c.store, ev.TenantID, h.KeyID); err != nil {
			return ev, fmt.Errorf("encrypt: event %s: %w", ev.ID, err)
		}
	}
	aead, err := newAEAD(dek)
	if err != nil {
		return ev, fmt.Errorf("%w: data key unusable", ErrDecrypt)
	}
	full := make([]byte, 0, len(nonce)+len(sealed))
	full = append(append(full, nonce...), sealed...)
	plain, err := open(aead, full, payloadAAD(hb, &ev))
	if err != nil {
		return ev, fmt.Errorf("%w: event %s: payload does not authenticate under key %s", ErrDecrypt, ev.ID, h.KeyID)
	}
	ev.Payload = plain
	ev.ContentType = h.ContentType
	return ev, nil
}

func checkSubject(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("the event names no subject (its event type is encrypted per subject)")
	case len(s) > MaxSubjectBytes:
		return fmt.Errorf("%d bytes exceeds the limit of %d bytes", len(s), MaxSubjectBytes)
	case !utf8.ValidString(s) || !printable(s):
		return fmt.Errorf("must be printable UTF-8")
	}
	return nil
}

// payloadAAD binds a payload to its envelope header and its event: a
// payload moved to another event, or a header edited, fails to open.
func payloadAAD(header []byte, e *ferry.Event) []byte {
	b := make([]byte, 0, len(header)+128)
	b = append(b, header...)
	return appendBinding(b, e)
}

// eventKeyAAD binds a wrapped per-event data key to its event.
func eventKeyAAD(e *ferry.Event) []byte {
	return appendBinding([]byte("ferry-event-key\x00"), e)
}

func appendBinding(b []byte, e *ferry.Event) []byte {
	for _, s := range []string{e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, e.EventType, strconv.Itoa(e.SchemaVersion)} {
		b = append(b, 0)
		b = append(b, s...)
	}
	return b
}
