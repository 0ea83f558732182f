package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// ferry erase end to end: preview, --reason required, approve and audit,
// and the sealed payload no longer opens; on SQLite, Postgres and MySQL.
func TestEraseCLI(t *testing.T) {
	sqlitePath := filepath.Join(t.TempDir(), "erase.db")
	for name, url := range map[string]string{
		"sqlite":   "sqlite:" + sqlitePath,
		"postgres": testenv.NewPostgresSchema(t).URL,
		"mysql":    testenv.NewMySQLDatabase(t).URL,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
			s, err := openStore(ctx, url, ferry.Tables{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ring, err := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": bytes.Repeat([]byte{5}, encrypt.KeySize)})
			if err != nil {
				t.Fatal(err)
			}
			var exec driver.Executor
			seal := func(opts ...encrypt.Option) *encrypt.Codec {
				c, err := encrypt.New(ring, append([]encrypt.Option{encrypt.WithEventType("customer.updated", encrypt.Rule{Subject: encrypt.SubjectFromTarget})}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			ev := ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: "c-7", EventType: "customer.updated", SchemaVersion: 1,
				Payload: []byte(`{"name":"CANARY-NAME"}`), Headers: ferry.Headers{Target: "customer/7"}}
			var evs []ferry.Event
			if s.dialect == driver.Postgres {
				drv := pgxv5.New(s.pool)
				exec = drv.Executor()
				w, err := outbox.New(drv, outbox.WithEncryption(seal()))
				if err != nil {
					t.Fatal(err)
				}
				evs, err = w.Insert(ctx, ev)
				if err != nil {
					t.Fatal(err)
				}
			} else {
				exec = s.sql.Executor()
				w, err := outbox.New(s.sql, outbox.WithEncryption(seal()))
				if err != nil {
					t.Fatal(err)
				}
				evs, err = w.Insert(ctx, ev)
				if err != nil {
					t.Fatal(err)
				}
			}
			opener := seal(encrypt.WithSubjectKeyStore(exec))
			if _, err := opener.Open(ctx, evs[0]); err != nil {
				t.Fatalf("control: opens before erasure: %v", err)
			}
			args := []string{"erase", "--database-url", url, "--tenant", "acme", "--subject", "customer/7"}
			out, err := runCLI(t, args...)
			if err != nil || !strings.Contains(out, "DRY RUN subject.erase: 1 live subject key(s) would be destroyed") || strings.Contains(out, "CANARY") {
				t.Fatalf("preview: %v\n%s", err, out)
			}
			if out, err := runCLI(t, append(args, "--approve", "--actor", "dpo")...); !errors.Is(err, ops.ErrReasonRequired) {
				t.Fatalf("approve without reason: %v\n%s", err, out)
			}
			if _, err := opener.Open(ctx, evs[0]); err != nil {
				t.Fatalf("refused erase must leave the key: %v", err)
			}
			out, err = runCLI(t, append(args, "--approve", "--actor", "dpo", "--reason", "erasure request 17", "--json")...)
			var res ops.EraseResult
			if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Rows != 1 || res.AuditID == 0 || len(res.Sample) != 1 || res.Sample[0].ErasedAt == nil {
				t.Fatalf("approve: %v\n%s", err, out)
			}
			if _, err := opener.Open(ctx, evs[0]); !errors.Is(err, encrypt.ErrSubjectErased) {
				t.Fatalf("after erase: %v, want ErrSubjectErased", err)
			}
			if out, err := runCLI(t, "erase", "--database-url", url, "--tenant", "acme"); err == nil || !strings.Contains(err.Error(), "--subject") {
				t.Fatalf("no subject: %v\n%s", err, out)
			}
		})
	}
}
