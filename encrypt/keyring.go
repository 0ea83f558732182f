package encrypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/ferryhq/ferry/internal/sanitize"
)

// Keyring holds key-encryption keys (KEKs) by id. Ferry asks it to wrap a
// fresh data key with the current KEK and to unwrap a data key with the
// KEK it names; the KEK itself never leaves the keyring, so a KMS (AWS KMS,
// GCP KMS, Vault transit) implements it with its encrypt/decrypt calls.
//
// aad is additional authenticated data binding the wrapped key to where it
// is used (an event, a subject key): Unwrap must fail unless it gets the
// same aad that Wrap got. Implementations must be safe for concurrent use.
type Keyring interface {
	// CurrentKeyID is the id new data keys are wrapped with. Rotation is
	// changing it: data wrapped under older ids still unwraps as long as
	// the keyring keeps those keys.
	CurrentKeyID() string
	// Wrap encrypts dataKey under the KEK keyID.
	Wrap(ctx context.Context, keyID string, dataKey, aad []byte) ([]byte, error)
	// Unwrap decrypts wrapped under the KEK keyID. An id the keyring does
	// not hold is ErrUnknownKey; a wrapped key that does not authenticate
	// (another key, other aad, tampered bytes) is ErrDecrypt.
	Unwrap(ctx context.Context, keyID string, wrapped, aad []byte) ([]byte, error)
}

// Sentinel errors. Every error of this package matches one of them and
// never quotes key material or payload bytes.
var (
	// ErrUnknownKey: the keyring holds no key with the id the data names.
	ErrUnknownKey = errors.New("encrypt: unknown key id")
	// ErrDecrypt: authentication failed (wrong key, other context, tampered bytes).
	ErrDecrypt = errors.New("encrypt: decryption failed")
	// ErrSubjectErased: the subject's data key was destroyed by erasure;
	// the payload is unrecoverable by design.
	ErrSubjectErased = errors.New("encrypt: subject key erased")
	// ErrMalformed: the payload is not a well-formed Ferry envelope.
	ErrMalformed = errors.New("encrypt: malformed envelope")
	// ErrInvalidKeyring: a keyring (file) is unusable; *KeyringError names the field.
	ErrInvalidKeyring = errors.New("encrypt: invalid keyring")
)

// KeySize is the size of every key: AES-256.
const KeySize = 32

// MaxKeyIDBytes bounds key ids (and subject key handles).
const MaxKeyIDBytes = 64

var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidKeyID reports whether id can name a key: 1..64 bytes of
// [A-Za-z0-9._-], starting with a letter or digit.
func ValidKeyID(id string) bool { return len(id) <= MaxKeyIDBytes && keyIDRE.MatchString(id) }

// KeyringError says which keyring field is wrong and why; File is the
// keyring file when it came from one. It never quotes key bytes.
type KeyringError struct {
	File   string
	Field  string
	Reason string
}

func (e *KeyringError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("encrypt: keyring file %s: %s: %s", e.File, e.Field, e.Reason)
	}
	return fmt.Sprintf("encrypt: keyring: %s: %s", e.Field, e.Reason)
}

// Is reports ErrInvalidKeyring.
func (e *KeyringError) Is(target error) bool { return target == ErrInvalidKeyring }

// LocalKeyring is a Keyring whose KEKs are in memory (AES-256-GCM key
// wrapping): the embedded default, loaded from a file by LoadKeyringFile.
type LocalKeyring struct {
	current string
	keys    map[string]cipher.AEAD
	ids     []string
}

var _ Keyring = (*LocalKeyring)(nil)

// NewLocalKeyring returns a keyring over keys (id → 32-byte key) whose
// current key is current. The key bytes are copied.
func NewLocalKeyring(current string, keys map[string][]byte) (*LocalKeyring, error) {
	return newLocal("", current, keys)
}

func newLocal(file, current string, keys map[string][]byte) (*LocalKeyring, error) {
	bad := func(field, format string, args ...any) error {
		return &KeyringError{File: file, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if len(keys) == 0 {
		return nil, bad("keys", "at least one key is needed")
	}
	k := &LocalKeyring{current: current, keys: make(map[string]cipher.AEAD, len(keys))}
	for id, b := range keys {
		if !ValidKeyID(id) {
			return nil, bad("keys", "key id %q must be 1..%d bytes of [A-Za-z0-9._-] starting with a letter or digit", cut(id), MaxKeyIDBytes)
		}
		if len(b) != KeySize {
			return nil, bad("keys."+id, "must be %d bytes (AES-256), got %d", KeySize, len(b))
		}
		aead, err := newAEAD(b)
		if err != nil {
			return nil, bad("keys."+id, "%v", err)
		}
		k.keys[id] = aead
		k.ids = append(k.ids, id)
	}
	slices.Sort(k.ids)
	if current == "" {
		return nil, bad("current", "must name the key new data is wrapped with")
	}
	if _, ok := k.keys[current]; !ok {
		return nil, bad("current", "%q is not one of the key ids %v", cut(current), k.ids)
	}
	return k, nil
}

// CurrentKeyID implements Keyring.
func (k *LocalKeyring) CurrentKeyID() string { return k.current }

// KeyIDs returns the ids the keyring holds, sorted.
func (k *LocalKeyring) KeyIDs() []string { return slices.Clone(k.ids) }

// Wrap implements Keyring: nonce ‖ AES-256-GCM(dataKey, aad).
func (k *LocalKeyring) Wrap(_ context.Context, keyID string, dataKey, aad []byte) ([]byte, error) {
	aead, ok := k.keys[keyID]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKey, cut(keyID))
	}
	return seal(aead, dataKey, aad)
}

// Unwrap implements Keyring.
func (k *LocalKeyring) Unwrap(_ context.Context, keyID string, wrapped, aad []byte) ([]byte, error) {
	aead, ok := k.keys[keyID]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKey, cut(keyID))
	}
	out, err := open(aead, wrapped, aad)
	if err != nil {
		return nil, fmt.Errorf("%w: data key wrapped under %q does not authenticate", ErrDecrypt, keyID)
	}
	return out, nil
}

// keyringFile is the JSON format of a keyring file (docs/ENCRYPTION.md):
//
//	{"current": "k2", "keys": [{"id": "k1", "key": "<base64 of 32 bytes>"}, {"id": "k2", "key": "…"}]}
type keyringFile struct {
	Current string `json:"current"`
	Keys    []struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	} `json:"keys"`
}

// MaxKeyringFileBytes bounds a keyring file.
const MaxKeyringFileBytes = 1 << 20

// LoadKeyringFile reads a keyring file (JSON: {"current": id, "keys":
// [{"id": …, "key": base64(32 bytes)}]}). The file must not be readable
// or writable by group or others (mode 0600 or stricter); errors name the
// file and the field, never the key bytes.
func LoadKeyringFile(path string) (*LocalKeyring, error) {
	bad := func(field, format string, args ...any) error {
		return &KeyringError{File: path, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("encrypt: keyring file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("encrypt: keyring file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, bad("mode", "not a regular file")
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, bad("mode", "permissions %04o let group or others read or write it; chmod 600 %s", perm, path)
	}
	raw, err := io.ReadAll(io.LimitReader(f, MaxKeyringFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("encrypt: keyring file %s: %w", path, err)
	}
	if len(raw) > MaxKeyringFileBytes {
		return nil, bad("size", "larger than %d bytes", MaxKeyringFileBytes)
	}
	var kf keyringFile
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kf); err != nil {
		// json errors may quote a value: keep only the position.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, bad("json", "syntax error at byte %d", se.Offset)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, bad(te.Field, "wrong JSON type (%s)", te.Value)
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return nil, bad("json", "%s", strings.TrimPrefix(err.Error(), "json: "))
		}
		return nil, bad("json", "not a keyring document")
	}
	keys := make(map[string][]byte, len(kf.Keys))
	for i, k := range kf.Keys {
		field := fmt.Sprintf("keys[%d]", i)
		if !ValidKeyID(k.ID) {
			return nil, bad(field+".id", "%q must be 1..%d bytes of [A-Za-z0-9._-] starting with a letter or digit", cut(k.ID), MaxKeyIDBytes)
		}
		if _, dup := keys[k.ID]; dup {
			return nil, bad(field+".id", "duplicate key id %q", k.ID)
		}
		b, err := base64.StdEncoding.DecodeString(k.Key)
		if err != nil {
			return nil, bad(field+".key", "not standard base64")
		}
		if len(b) != KeySize {
			return nil, bad(field+".key", "must decode to %d bytes (AES-256), got %d", KeySize, len(b))
		}
		keys[k.ID] = b
	}
	return newLocal(path, kf.Current, keys)
}

// NewKey returns a fresh random 32-byte key, base64-encoded for a keyring file.
func NewKey() (string, error) {
	b := make([]byte, KeySize)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("encrypt: random key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal returns nonce ‖ ciphertext ‖ tag.
func seal(aead cipher.AEAD, plaintext, aad []byte) ([]byte, error) {
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("encrypt: random nonce: %w", err)
	}
	return aead.Seal(out, out, plaintext, aad), nil
}

func open(aead cipher.AEAD, sealed, aad []byte) ([]byte, error) {
	n := aead.NonceSize()
	if len(sealed) < n+aead.Overhead() {
		return nil, ErrDecrypt
	}
	return aead.Open(nil, sealed[:n], sealed[n:], aad)
}

// cut shortens s (a key id from outside) for an error message.
func cut(s string) string { return sanitize.Text(s, MaxKeyIDBytes) }
