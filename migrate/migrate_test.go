package migrate

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

func TestLoadRendersEveryMigrationForBothDialects(t *testing.T) {
	for _, d := range []driver.Dialect{driver.Postgres, driver.SQLite} {
		ms, err := Load(d, ferry.Tables{Prefix: "app_"})
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if len(ms) < 6 {
			t.Fatalf("%s: %d migrations", d, len(ms))
		}
		for i, m := range ms {
			if m.Version != i+1 {
				t.Fatalf("%s: migration %d has version %d; versions must run 1..n without gaps", d, i, m.Version)
			}
			if strings.Contains(m.SQL, "{{") || strings.Contains(m.SQL, `"ferry_`) {
				t.Fatalf("%s %04d: unrendered template or default prefix left:\n%s", d, m.Version, m.SQL)
			}
		}
		if !strings.Contains(ms[0].SQL, `CREATE TABLE "app_outbox"`) {
			t.Fatalf("%s: prefix not applied:\n%s", d, ms[0].SQL)
		}
	}
}

func TestSQLQualifiesWithSchema(t *testing.T) {
	ddl, err := SQL(driver.Postgres, ferry.Tables{Schema: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ddl, `CREATE SCHEMA IF NOT EXISTS "billing";`) || !strings.Contains(ddl, `CREATE TABLE "billing"."ferry_outbox"`) {
		t.Fatalf("DDL:\n%.400s", ddl)
	}
}

func TestLoadRejectsBadConfiguration(t *testing.T) {
	if _, err := Load(driver.SQLite, ferry.Tables{Schema: "x"}); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("schema on SQLite: %v", err)
	}
	if _, err := Load(driver.Postgres, ferry.Tables{Prefix: `x"; DROP TABLE y; --`}); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("injection through prefix: %v", err)
	}
	if _, err := Load("oracle", ferry.Tables{}); err == nil {
		t.Fatal("unknown dialect accepted")
	}
}

func TestSplitStatements(t *testing.T) {
	got := splitStatements("-- comment;\nCREATE TABLE a (x int);\n\nCREATE INDEX i ON a (x)\n  WHERE x > 0;\nSELECT 1")
	want := []string{"CREATE TABLE a (x int);", "CREATE INDEX i ON a (x)\n  WHERE x > 0;", "SELECT 1"}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("statement %d = %q, want %q", i, got[i], want[i])
		}
	}
}
