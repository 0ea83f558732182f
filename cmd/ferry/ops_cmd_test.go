package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// The operator commands end to end through the CLI: dry run by default,
// --approve acts and audits, --reason required, cleanup guard, status and
// evidence as JSON.
func TestOpsCommandsCLI(t *testing.T) {
	sqlitePath := filepath.Join(t.TempDir(), "ops.db")
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
			var evs []ferry.Event
			mk := func(agg string) ferry.Event {
				return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: agg, EventType: "order.created", SchemaVersion: 1,
					Payload: []byte(`{}`), Headers: ferry.Headers{Principal: "bob", CorrelationID: "corr-cli"}}
			}
			if s.dialect == driver.Postgres {
				w, err := outbox.New(pgxv5.New(s.pool))
				if err != nil {
					t.Fatal(err)
				}
				evs, err = w.Insert(ctx, mk("1"), mk("2"))
				if err != nil {
					t.Fatal(err)
				}
			} else {
				w, err := outbox.New(s.sql) // SQLite's or MySQL's databasesql driver
				if err != nil {
					t.Fatal(err)
				}
				evs, err = w.Insert(ctx, mk("1"), mk("2"))
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'dead', attempts = 9, last_error = 'rejected'`); err != nil {
				t.Fatal(err)
			}
			db := []string{"--database-url", url}
			audits := func() int {
				o, err := ops.New(s)
				if err != nil {
					t.Fatal(err)
				}
				a, err := o.Audit(ctx, 100)
				if err != nil {
					t.Fatal(err)
				}
				return len(a)
			}

			out, err := runCLI(t, append([]string{"dlq", "list"}, db...)...)
			if err != nil || !strings.Contains(out, "2 dead letter(s)") {
				t.Fatalf("dlq list: %v\n%s", err, out)
			}
			out, err = runCLI(t, append([]string{"dlq", "retry", "--aggregate", "1", "--reason", "fixed"}, db...)...)
			if err != nil || !strings.Contains(out, "DRY RUN dlq.retry: 1 row(s) would change") {
				t.Fatalf("dry run: %v\n%s", err, out)
			}
			if out, _ := runCLI(t, append([]string{"dlq", "list"}, db...)...); !strings.Contains(out, "2 dead letter(s)") || audits() != 0 {
				t.Fatalf("the dry run changed something:\n%s", out)
			}
			if _, err := runCLI(t, append([]string{"dlq", "retry", "--aggregate", "1", "--approve"}, db...)...); err == nil || !strings.Contains(err.Error(), "reason") {
				t.Fatalf("approve without --reason: %v", err)
			}
			out, err = runCLI(t, append([]string{"dlq", "retry", "--aggregate", "1", "--approve", "--reason", "fixed", "--actor", "carol"}, db...)...)
			if err != nil || !strings.Contains(out, "dlq.retry: 1 row(s) changed (audit #") {
				t.Fatalf("approve: %v\n%s", err, out)
			}
			if n := audits(); n != 1 {
				t.Fatalf("%d audit rows, want 1", n)
			}

			out, err = runCLI(t, append([]string{"status", "--json"}, db...)...)
			if err != nil {
				t.Fatalf("status: %v\n%s", err, out)
			}
			var st ops.Status
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status json: %v\n%s", err, out)
			}
			if st.Outbox.Pending != 1 || st.Outbox.Dead != 1 {
				t.Fatalf("status outbox %+v, want 1 pending and 1 dead", st.Outbox)
			}
			if out, err := runCLI(t, append([]string{"status"}, db...)...); err != nil || !strings.Contains(out, "OUTBOX  pending 1") {
				t.Fatalf("status table: %v\n%s", err, out)
			}

			out, err = runCLI(t, append([]string{"evidence", evs[0].ID.String(), "--json"}, db...)...)
			if err != nil {
				t.Fatalf("evidence: %v\n%s", err, out)
			}
			var ev ops.Evidence
			if err := json.Unmarshal([]byte(out), &ev); err != nil || len(ev.Events) != 1 || ev.Events[0].Committed == nil ||
				ev.Events[0].Committed.Principal != "bob" || len(ev.Events[0].Audit) != 1 {
				t.Fatalf("evidence json %v: %s", err, out)
			}
			if out, err := runCLI(t, append([]string{"evidence", "corr-cli"}, db...)...); err != nil || !strings.Contains(out, "2 event(s)") {
				t.Fatalf("evidence by correlation: %v\n%s", err, out)
			}

			_, err = runCLI(t, append([]string{"cleanup", "--older-than", "1h", "--approve", "--reason", "x"}, db...)...)
			if err == nil || !strings.Contains(err.Error(), "retention 1h0m0s is shorter than the replay window 168h0m0s") {
				t.Fatalf("cleanup guard: %v", err)
			}
			if out, err := runCLI(t, append([]string{"cleanup", "--older-than", "200h", "--reason", "x"}, db...)...); err != nil || !strings.Contains(out, "DRY RUN") {
				t.Fatalf("cleanup dry run: %v\n%s", err, out)
			}
			if out, err := runCLI(t, append([]string{"parked", "list", "--consumer", "billing"}, db...)...); err != nil || !strings.Contains(out, "0 parked message(s)") {
				t.Fatalf("parked list: %v\n%s", err, out)
			}
			if out, err := runCLI(t, append([]string{"replay", "--all", "--reason", "x", "--json"}, db...)...); err != nil || !strings.Contains(out, `"dry_run": true`) {
				t.Fatalf("replay dry run: %v\n%s", err, out)
			}
		})
	}
}
