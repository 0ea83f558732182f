package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runCLIContext(context.Background(), args...)
}

// runCLIContext runs the root command with args; output is collected in a
// buffer that is safe to read only after the command returned.
func runCLIContext(ctx context.Context, args ...string) (string, error) {
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// `ferry migrate sql` must print DDL that applies cleanly to a fresh
// Postgres database (here: a fresh schema), for users of other tools.
func TestMigrateSQLAppliesToFreshPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ddl, err := runCLI(t, "migrate", "sql")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ddl, `CREATE TABLE "ferry_outbox"`) {
		t.Fatalf("unexpected DDL:\n%s", ddl)
	}
	if _, err := s.Pool.Exec(context.Background(), ddl); err != nil {
		t.Fatalf("DDL does not apply: %v", err)
	}
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ferry_outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("outbox after DDL: %d, %v", n, err)
	}
}

func TestMigrateSQLRejectsBadNames(t *testing.T) {
	// Named by the flag the user typed.
	if _, err := runCLI(t, "migrate", "sql", "--schema", `x"; DROP TABLE y; --`); err == nil || !strings.Contains(err.Error(), "--schema must match") {
		t.Fatalf("err = %v", err)
	}
	if _, err := runCLI(t, "migrate", "sql", "--dialect", "oracle"); err == nil {
		t.Fatal("unknown dialect accepted")
	}
}

func TestMigrateUpStatusCLI(t *testing.T) {
	for name, url := range map[string]string{
		"sqlite":   "sqlite:" + filepath.Join(t.TempDir(), "x.db"),
		"postgres": testenv.NewPostgresSchema(t).URL,
	} {
		t.Run(name, func(t *testing.T) {
			out, err := runCLI(t, "migrate", "status", "--database-url", url)
			if name == "sqlite" {
				// A read-only command never creates the file.
				if err == nil || !strings.Contains(err.Error(), "does not exist") {
					t.Fatalf("status before on a missing SQLite file: %v\n%s", err, out)
				}
			} else if err != nil || !strings.Contains(out, "version 0 of") || !strings.Contains(out, "pending  0001_outbox") {
				t.Fatalf("status before: %v\n%s", err, out)
			}
			out, err = runCLI(t, "migrate", "up", "--database-url", url)
			if err != nil || !strings.Contains(out, "applied 0001_outbox") {
				t.Fatalf("up: %v\n%s", err, out)
			}
			out, err = runCLI(t, "migrate", "up", "--database-url", url)
			if err != nil || !strings.Contains(out, "nothing to apply") {
				t.Fatalf("second up: %v\n%s", err, out)
			}
			out, err = runCLI(t, "migrate", "status", "--database-url", url)
			if err != nil || strings.Contains(out, "pending") || !strings.Contains(out, "applied  0001_outbox") {
				t.Fatalf("status after: %v\n%s", err, out)
			}
		})
	}
}

// TestDemo runs the README's first command in-process: it must finish by
// itself and show both parts with a clean verdict.
func TestDemo(t *testing.T) {
	out, err := runCLI(t, "demo")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"0 events for the rolled-back order",
		"Every order charged exactly once",
		"Part 3: the whole pipeline under faults",
		"duplicate effects (charges)",
		"Every committed event applied exactly once",
		"Demo finished in ",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}
