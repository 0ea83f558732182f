package encrypt_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/encrypt"
)

func writeKeyring(t *testing.T, mode os.FileMode, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keyring.json")
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, encrypt.KeySize) }

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestKeyringFileLoadsAndRefusesLoosePermissions(t *testing.T) {
	body := `{"current": "k2", "keys": [{"id": "k1", "key": "` + b64(key(1)) + `"}, {"id": "k2", "key": "` + b64(key(2)) + `"}]}`
	p := writeKeyring(t, 0o600, body)
	k, err := encrypt.LoadKeyringFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if k.CurrentKeyID() != "k2" || strings.Join(k.KeyIDs(), ",") != "k1,k2" {
		t.Fatalf("current %q ids %v", k.CurrentKeyID(), k.KeyIDs())
	}
	// Negative control: the same file readable by the group is refused, naming the file and the field.
	loose := writeKeyring(t, 0o640, body)
	_, err = encrypt.LoadKeyringFile(loose)
	var ke *encrypt.KeyringError
	if !errors.As(err, &ke) || !errors.Is(err, encrypt.ErrInvalidKeyring) || ke.Field != "mode" || !strings.Contains(err.Error(), loose) || !strings.Contains(err.Error(), "0640") {
		t.Fatalf("0640: err = %v", err)
	}
}

func TestKeyringFileErrorsNameTheFieldNeverTheKey(t *testing.T) {
	secret := b64(key(7))
	for name, tc := range map[string]struct{ body, field string }{
		"short key":       {`{"current": "a", "keys": [{"id": "a", "key": "` + b64(key(7)[:16]) + `"}]}`, "keys[0].key"},
		"not base64":      {`{"current": "a", "keys": [{"id": "a", "key": "` + secret[:10] + `!!"}]}`, "keys[0].key"},
		"bad id":          {`{"current": "a", "keys": [{"id": "a b", "key": "` + secret + `"}]}`, "keys[0].id"},
		"duplicate id":    {`{"current": "a", "keys": [{"id": "a", "key": "` + secret + `"}, {"id": "a", "key": "` + secret + `"}]}`, "keys[1].id"},
		"unknown current": {`{"current": "zz", "keys": [{"id": "a", "key": "` + secret + `"}]}`, "current"},
		"no keys":         {`{"current": "a", "keys": []}`, "keys"},
		"unknown field":   {`{"current": "a", "secret": "` + secret + `", "keys": [{"id": "a", "key": "` + secret + `"}]}`, "json"},
		"syntax":          {`{"current": "a", "keys": [{"id": "a", "key": "` + secret + `"`, "json"},
	} {
		t.Run(name, func(t *testing.T) {
			p := writeKeyring(t, 0o600, tc.body)
			_, err := encrypt.LoadKeyringFile(p)
			var ke *encrypt.KeyringError
			if !errors.As(err, &ke) || ke.Field != tc.field || ke.File != p {
				t.Fatalf("err = %v, want field %s of %s", err, tc.field, p)
			}
			if strings.Contains(err.Error(), secret[:10]) {
				t.Fatalf("error quotes key material: %v", err)
			}
		})
	}
}

func TestLocalKeyringWrapUnwrap(t *testing.T) {
	ctx := context.Background()
	k, err := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": key(1), "k2": key(2)})
	if err != nil {
		t.Fatal(err)
	}
	dek := key(9)
	w, err := k.Wrap(ctx, "k1", dek, []byte("aad"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Unwrap(ctx, "k1", w, []byte("aad"))
	if err != nil || !bytes.Equal(got, dek) {
		t.Fatalf("unwrap: %v", err)
	}
	if _, err := k.Unwrap(ctx, "k2", w, []byte("aad")); !errors.Is(err, encrypt.ErrDecrypt) {
		t.Fatalf("other key: %v, want ErrDecrypt", err)
	}
	if _, err := k.Unwrap(ctx, "k1", w, []byte("other")); !errors.Is(err, encrypt.ErrDecrypt) {
		t.Fatalf("other aad: %v, want ErrDecrypt", err)
	}
	if _, err := k.Unwrap(ctx, "k3", w, []byte("aad")); !errors.Is(err, encrypt.ErrUnknownKey) {
		t.Fatalf("unknown id: %v, want ErrUnknownKey", err)
	}
}
