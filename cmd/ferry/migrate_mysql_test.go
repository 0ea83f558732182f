package main

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestMigrateMySQLCLI: ferry migrate up|status on MariaDB/MySQL, then
// ferry migrate sql --dialect mysql applied statement by statement to a
// second fresh database, for users of other migration tools.
func TestMigrateMySQLCLI(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	out, err := runCLI(t, "migrate", "up", "--database-url", d.URL)
	if err != nil || !strings.Contains(out, "applied 0009_overview") {
		t.Fatalf("up: %v\n%s", err, out)
	}
	out, err = runCLI(t, "migrate", "up", "--database-url", d.URL)
	if err != nil || !strings.Contains(out, "nothing to apply") {
		t.Fatalf("second up: %v\n%s", err, out)
	}
	out, err = runCLI(t, "migrate", "status", "--database-url", d.URL)
	if err != nil || !strings.Contains(out, "version 13 of 13") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	ddl, err := runCLI(t, "migrate", "sql", "--dialect", "mysql")
	if err != nil || !strings.Contains(ddl, "CREATE TABLE `ferry_outbox`") {
		t.Fatalf("sql: %v\n%.300s", err, ddl)
	}
	fresh := testenv.NewMySQLDatabase(t)
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := fresh.DB.Exec(stmt); err != nil {
			t.Fatalf("DDL does not apply: %v\n%s", err, stmt)
		}
	}
	if _, err := runCLI(t, "status", "--database-url", fresh.URL); err != nil && strings.Contains(err.Error(), "not installed") {
		t.Fatalf("tables applied from migrate sql not found: %v", err)
	}
	empty := testenv.NewMySQLDatabase(t)
	if _, err := runCLI(t, "status", "--database-url", empty.URL); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("status on an empty database: %v", err)
	}
}
