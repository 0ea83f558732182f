package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// ferry keys rewrap on SQLite: preview counts, --reason required, approve
// re-wraps and audits, a keyring without k1 then opens the old payload,
// and a second run re-wraps nothing. Control: before it, the k1-less
// keyring cannot open it.
func TestKeysRewrapCLI(t *testing.T) {
	ctx := context.Background()
	url := "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	s, err := openStore(ctx, url, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k1, k2 := bytes.Repeat([]byte{1}, encrypt.KeySize), bytes.Repeat([]byte{2}, encrypt.KeySize)
	codec := func(r encrypt.Keyring) *encrypt.Codec {
		c, err := encrypt.New(r, encrypt.WithEventType("customer.updated", encrypt.Rule{Subject: encrypt.SubjectFromTarget}), encrypt.WithSubjectKeyStore(s.sql.Executor()))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old, _ := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": k1})
	w, err := outbox.New(s.sql, outbox.WithEncryption(codec(old)))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: "c-7", EventType: "customer.updated", SchemaVersion: 1,
		Payload: []byte(`{"name":"x"}`), Headers: ferry.Headers{Target: "customer/7"}})
	if err != nil {
		t.Fatal(err)
	}
	retired, _ := encrypt.NewLocalKeyring("k2", map[string][]byte{"k2": k2})
	if _, err := codec(retired).Open(ctx, evs[0]); !errors.Is(err, encrypt.ErrUnknownKey) {
		t.Fatalf("control: k1-less keyring before rewrap: %v, want ErrUnknownKey", err)
	}
	kr := filepath.Join(t.TempDir(), "keyring.json")
	body := `{"current": "k2", "keys": [{"id": "k1", "key": "` + base64.StdEncoding.EncodeToString(k1) + `"}, {"id": "k2", "key": "` + base64.StdEncoding.EncodeToString(k2) + `"}]}`
	if err := os.WriteFile(kr, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"keys", "rewrap", "--database-url", url, "--keyring", kr}
	out, err := runCLI(t, args...)
	if err != nil || !strings.Contains(out, "DRY RUN subject_keys.rewrap: 1 subject key(s) would be re-wrapped under k2") || !strings.Contains(out, "from k1: 1") {
		t.Fatalf("preview: %v\n%s", err, out)
	}
	if _, err := codec(retired).Open(ctx, evs[0]); err == nil {
		t.Fatal("preview changed the key")
	}
	if out, err := runCLI(t, append(args, "--approve", "--actor", "ops")...); !errors.Is(err, ops.ErrReasonRequired) {
		t.Fatalf("approve without reason: %v\n%s", err, out)
	}
	out, err = runCLI(t, append(args, "--approve", "--actor", "ops", "--reason", "retire k1", "--json")...)
	var res ops.RewrapResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Rows != 1 || res.From["k1"] != 1 || res.AuditID == 0 {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	got, err := codec(retired).Open(ctx, evs[0])
	if err != nil || string(got.Payload) != `{"name":"x"}` {
		t.Fatalf("after rewrap, k1-less keyring: %q %v", got.Payload, err)
	}
	out, err = runCLI(t, append(args, "--approve", "--actor", "ops", "--reason", "again", "--json")...)
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Rows != 0 {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "keys", "rewrap", "--database-url", url); err == nil || !strings.Contains(err.Error(), "--keyring") {
		t.Fatalf("no keyring: %v", err)
	}
}
