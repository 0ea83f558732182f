package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestCLIAsANewcomer: what a new user types by mistake gets a clear error
// that names what is accepted or what to do, and never a silent success or
// a file created on the side.
func TestCLIAsANewcomer(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil { // a valid, empty SQLite database
		t.Fatal(err)
	}
	migrated := "sqlite:" + filepath.Join(dir, "ferry.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", migrated); err != nil {
		t.Fatalf("migrate up: %v\n%s", err, out)
	}
	pg := testenv.NewPostgresSchema(t)

	for _, c := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string // every fragment must be in the error
		wantOut []string // every fragment must be in the output (no error)
	}{
		{name: "unsupported scheme", args: []string{"status", "--database-url", "mongodb://root@127.0.0.1:27017/test"},
			wantErr: []string{`scheme "mongodb"`, "not supported", "postgres://", "sqlite:PATH", "mysql://"}},
		{name: "mysql without tables", args: []string{"status", "--database-url", "mysql://root@127.0.0.1:3306/ferry_newcomer_absent"},
			wantErr: []string{"mysql", "ferry_newcomer_absent"}},
		{name: "http scheme", args: []string{"dlq", "list", "--database-url", "http://example.test/db"},
			wantErr: []string{`scheme "http"`, "postgres://"}},
		{name: "misspelt postgres", args: []string{"status", "--database-url", "postgress://postgres@127.0.0.1/test"},
			wantErr: []string{`scheme "postgress"`, "postgresql://"}},
		{name: "password redacted", args: []string{"status", "--database-url", "mongodb://root:hunter2@127.0.0.1/test"},
			wantErr: []string{`scheme "mongodb"`, "xxxxx"}},
		{name: "bare name", args: []string{"status", "--database-url", "newcomer_db"},
			wantErr: []string{`"newcomer_db" is neither a URL nor a SQLite file name`, ".db"}},
		{name: "missing sqlite file", args: []string{"parked", "list", "--database-url", "sqlite:" + filepath.Join(dir, "nope.db")},
			wantErr: []string{"does not exist", "ferry migrate up --database-url sqlite:"}},
		{name: "missing file by extension", args: []string{"evidence", "0190e5f8-0000-7000-8000-000000000001", "--database-url", "typo.db"},
			wantErr: []string{"does not exist"}},
		{name: "sqlite without tables", args: []string{"dlq", "list", "--database-url", "sqlite:" + empty},
			wantErr: []string{"not installed", "ferry_outbox", "ferry migrate up"}},
		{name: "postgres without tables", args: []string{"status", "--database-url", pg.URL},
			wantErr: []string{"not installed", "ferry_outbox", "ferry migrate up"}},
		{name: "no database", args: []string{"status"},
			wantErr: []string{"--database-url", "FERRY_DATABASE_URL"}},
		{name: "unknown subcommand", args: []string{"migrate", "down"},
			wantErr: []string{`unknown command "down" for "ferry migrate"`, "available: sql, status, up"}},
		{name: "unknown nested subcommand", args: []string{"dlq", "purge"},
			wantErr: []string{`unknown command "purge" for "ferry dlq"`}},
		{name: "unknown top-level command", args: []string{"serve"},
			wantErr: []string{`unknown command "serve" for "ferry"`}},
		{name: "group alone prints help", args: []string{"migrate"},
			wantOut: []string{"Usage:", "ferry migrate [command]"}},
		{name: "version", args: []string{"--version"},
			wantOut: []string{"ferry ", "go1."}},
		{name: "environment database url", args: []string{"migrate", "status"}, env: map[string]string{"FERRY_DATABASE_URL": migrated},
			wantOut: []string{"applied  0001_outbox"}},
		{name: "bad environment value", args: []string{"migrate", "status", "--database-url", migrated}, env: map[string]string{"FERRY_JSON": "maybe"},
			wantErr: []string{"FERRY_JSON", `"maybe"`, "--json"}},
		{name: "relay shards named by flag", args: []string{"relay", "--shards", "-1", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--shards must be in 1..4096, got -1"}},
		{name: "relay backoff named by flag", args: []string{"relay", "--backoff-base", "2s", "--backoff-max", "1s", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--backoff-base/--backoff-max need 0 < base <= max"}},
		{name: "relay dead policy named by flag", args: []string{"relay", "--dead-policy", "drop", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--dead-policy must be"}},
		{name: "relay cleanup interval", args: []string{"relay", "--cleanup-interval", "-1h", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--cleanup-interval must be >= 0"}},
		// Refused before connecting: nothing listens on port 1.
		{name: "relay cdc on mysql", args: []string{"relay", "--mode", "cdc", "--database-url", "mysql://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--mode cdc needs a Postgres --database-url", "mysql", "--mode poll"}},
		{name: "relay cdc pending bytes named by flag", args: []string{"relay", "--mode", "cdc", "--max-pending-bytes", "0", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--broker-url", "embedded"},
			wantErr: []string{"--max-pending-bytes must be in 1..1073741824, got 0"}},
		{name: "relay cdc on sqlite", args: []string{"relay", "--mode", "cdc", "--database-url", "sqlite:none.db", "--broker-url", "embedded"},
			wantErr: []string{"--mode cdc needs a Postgres --database-url", "sqlite"}},
		{name: "status negative watch", args: []string{"status", "--watch", "-1s", "--database-url", migrated},
			wantErr: []string{"--watch must be >= 0", "-1s"}},
		{name: "status negative soft cap", args: []string{"status", "--soft-cap", "-5", "--database-url", migrated},
			wantErr: []string{"--soft-cap must be >= 0", "-5"}},
		{name: "status soft cap above hard cap", args: []string{"status", "--soft-cap", "10", "--hard-cap", "5", "--database-url", migrated},
			wantErr: []string{"--soft-cap 10 is above --hard-cap 5"}},
		{name: "cleanup zero batch", args: []string{"cleanup", "--older-than", "192h", "--batch-size", "0", "--database-url", migrated},
			wantErr: []string{"--batch-size must be in 1..", "got 0"}},
		{name: "prove refuses sqlite url", args: []string{"prove", "--database-url", "sqlite:x.db", "--scenario", "relay-sigkill"},
			wantErr: []string{"--database-url", "only postgres://"}},
		{name: "prove refuses bad scheme", args: []string{"prove", "--database-url", "mongodb://x@y/z"},
			wantErr: []string{`scheme "mongodb"`}},
		{name: "bench help names every subcommand", args: []string{"bench", "--help"},
			wantOut: []string{"produce (outbox write cost)", "relay (drain rate", "consume (inbox apply rate"}},
		{name: "relay help names amqp", args: []string{"relay", "--help"},
			wantOut: []string{"amqp://user:pass@host:port/vhost", "127.0.0.1:9464"}},
		{name: "migrate status json", args: []string{"migrate", "status", "--json", "--database-url", migrated},
			wantOut: []string{`"current":`, `"pending": []`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			out, err := runCLI(t, c.args...)
			if len(c.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ferry %s succeeded; want an error with %q\n%s", strings.Join(c.args, " "), c.wantErr, out)
				}
				for _, w := range c.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				if n := strings.Count(errorLine(err), "ferry: ferry:"); n != 0 {
					t.Errorf("error printed with a doubled prefix: %s", errorLine(err))
				}
				return
			}
			if err != nil {
				t.Fatalf("ferry %s: %v\n%s", strings.Join(c.args, " "), err, out)
			}
			for _, w := range c.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	// Nothing above created a file, but migrate up.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case "empty.db", "ferry.db", "ferry.db-wal", "ferry.db-shm", "empty.db-wal", "empty.db-shm":
		default:
			t.Errorf("a command created %s", e.Name())
		}
	}
	// The JSON of migrate status is a document, current = latest.
	out, err := runCLI(t, "migrate", "status", "--json", "--database-url", migrated)
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Current, Latest int }
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Current == 0 || st.Current != st.Latest {
		t.Fatalf("migrate status --json: %v %+v\n%s", err, st, out)
	}
}

func TestErrorLineSaysFerryOnce(t *testing.T) {
	for in, want := range map[string]string{
		"ferry: invalid config: x":  "ferry: invalid config: x",
		"connect postgres: refused": "ferry: connect postgres: refused",
	} {
		if got := errorLine(errors.New(in)); got != want {
			t.Errorf("errorLine(%q) = %q, want %q", in, got, want)
		}
	}
}
