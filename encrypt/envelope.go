package encrypt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// ContentType is the datacontenttype of an encrypted event: the data is a
// Ferry envelope (below), whatever the plaintext's type, which the
// envelope carries and the inbox restores before the handler runs.
const ContentType = "application/vnd.ferry.encrypted"

// Mode says where an envelope's data key lives.
type Mode byte

// The modes.
const (
	// ModeEvent: a fresh data key per event, wrapped by the keyring's KEK
	// and carried in the envelope.
	ModeEvent Mode = 1
	// ModeSubject: the data key of one data subject (a customer), kept in
	// the subject_keys table and named by its handle; erasing the subject
	// destroys it and with it every copy of the subject's payloads.
	ModeSubject Mode = 2
)

func (m Mode) String() string {
	switch m {
	case ModeEvent:
		return "event"
	case ModeSubject:
		return "subject"
	}
	return fmt.Sprintf("mode(%d)", byte(m))
}

// Header is the clear part of an envelope: everything needed to find the
// key, readable without any key (Inspect).
type Header struct {
	Mode Mode
	// KeyID is, for ModeEvent, the KEK that wrapped the data key; for
	// ModeSubject, the subject key's handle (an opaque id, not the subject).
	KeyID string
	// ContentType is the plaintext's content type.
	ContentType string
	// WrappedKey is the wrapped data key (ModeEvent only).
	WrappedKey []byte
}

// Envelope layout, version 1 (all lengths big-endian):
//
//	"FRYE" 0x01 | mode (1) | len (1) key id | len (1) content type |
//	[ModeEvent: len (2) wrapped key] | nonce (12) | ciphertext ‖ tag (>= 16)
//
// The header bytes (everything before the nonce) are authenticated data
// of the payload's encryption, together with the event's identity, so
// neither can be swapped.
var magic = []byte("FRYE\x01")

// Limits of the header fields.
const (
	maxContentType = 255
	maxWrappedKey  = 1024
	nonceSize      = 12
	tagSize        = 16
)

func (h Header) check() error {
	switch {
	case h.Mode != ModeEvent && h.Mode != ModeSubject:
		return fmt.Errorf("%w: unknown mode %d", ErrMalformed, byte(h.Mode))
	case !ValidKeyID(h.KeyID):
		return fmt.Errorf("%w: key id must be 1..%d bytes of [A-Za-z0-9._-]", ErrMalformed, MaxKeyIDBytes)
	case h.ContentType == "" || len(h.ContentType) > maxContentType || !printable(h.ContentType):
		return fmt.Errorf("%w: content type must be 1..%d printable bytes", ErrMalformed, maxContentType)
	case h.Mode == ModeEvent && (len(h.WrappedKey) == 0 || len(h.WrappedKey) > maxWrappedKey):
		return fmt.Errorf("%w: wrapped key must be 1..%d bytes", ErrMalformed, maxWrappedKey)
	case h.Mode == ModeSubject && len(h.WrappedKey) != 0:
		return fmt.Errorf("%w: a subject envelope carries no wrapped key", ErrMalformed)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// appendHeader encodes h (checked) after dst.
func appendHeader(dst []byte, h Header) ([]byte, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	dst = append(dst, magic...)
	dst = append(dst, byte(h.Mode), byte(len(h.KeyID)))
	dst = append(dst, h.KeyID...)
	dst = append(dst, byte(len(h.ContentType)))
	dst = append(dst, h.ContentType...)
	if h.Mode == ModeEvent {
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(h.WrappedKey)))
		dst = append(dst, h.WrappedKey...)
	}
	return dst, nil
}

// parse splits an envelope into its header, the header's bytes, the
// nonce and the sealed data. It never panics and never copies.
func parse(b []byte) (h Header, headerBytes, nonce, sealed []byte, err error) {
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrMalformed, what) }
	if !bytes.HasPrefix(b, magic) {
		return h, nil, nil, nil, bad("no Ferry envelope magic (or another version)")
	}
	p := len(magic)
	need := func(n int) bool { return len(b)-p >= n }
	if !need(2) {
		return h, nil, nil, nil, bad("truncated header")
	}
	h.Mode = Mode(b[p])
	n := int(b[p+1])
	p += 2
	if !need(n + 1) {
		return h, nil, nil, nil, bad("truncated key id")
	}
	h.KeyID = string(b[p : p+n])
	p += n
	n = int(b[p])
	p++
	if !need(n) {
		return h, nil, nil, nil, bad("truncated content type")
	}
	h.ContentType = string(b[p : p+n])
	p += n
	if h.Mode == ModeEvent {
		if !need(2) {
			return h, nil, nil, nil, bad("truncated wrapped key")
		}
		n = int(binary.BigEndian.Uint16(b[p:]))
		p += 2
		if !need(n) {
			return h, nil, nil, nil, bad("truncated wrapped key")
		}
		h.WrappedKey = b[p : p+n]
		p += n
	}
	if err := h.check(); err != nil {
		return h, nil, nil, nil, err
	}
	if !need(nonceSize + tagSize) {
		return h, nil, nil, nil, bad("truncated ciphertext")
	}
	return h, b[:p], b[p : p+nonceSize], b[p+nonceSize:], nil
}

// Inspect reads an envelope's clear header without any key: which mode,
// key id (or subject key handle) and plaintext content type. The returned
// WrappedKey aliases payload.
func Inspect(payload []byte) (Header, error) {
	h, _, _, _, err := parse(payload)
	if err != nil {
		return Header{}, err
	}
	return h, nil
}

// IsEnvelope reports whether payload starts like a Ferry envelope.
func IsEnvelope(payload []byte) bool { return bytes.HasPrefix(payload, magic) }
