package prove

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestMySQLMatrix runs every scenario on MySQL/MariaDB (each in its own
// database, dropped afterwards): zero violations for the real ones, the
// negative controls still caught, and only the CDC scenarios (they read
// Postgres' WAL) not available. The database outage cuts the relays'
// connections to MariaDB through the fault proxy.
func TestMySQLMatrix(t *testing.T) {
	parallelUnlessRace(t)
	u := testenv.MySQLURL(t)
	rep, err := Run(context.Background(), small(WithDatabaseURL(u))...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	if rep.Stack != "mysql+nats(embedded)" {
		t.Errorf("stack %q", rep.Stack)
	}
	if len(rep.Results) != len(allScenarios()) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(allScenarios()))
	}
	unavailable := map[string]bool{"cdc-restart": true, "control-cdc-start-from-current-wal": true, "control-cdc-confirm-before-mark": true}
	for _, r := range rep.Results {
		if r.Status == StatusNotAvailable && strings.Contains(r.Note, "nats-cluster") {
			unavailable[r.Scenario] = true // broker scenarios of prove's own NATS cluster: another stack
		}
	}
	assertMatrix(t, rep, unavailable)
	for _, name := range []string{"relay-crash-after-publish", "consumer-ack-loss", "relay-sigkill", "inbox-sigkill", "effect-worker-sigkill", "concurrent-relays"} {
		if r, _ := rep.Result(name); r.Figures.FaultsInjected == 0 {
			t.Errorf("%s: no fault fired", name)
		}
	}
	if r, _ := rep.Result("database-outage"); r.Figures.LagMax == 0 {
		t.Errorf("database-outage: nothing waited through the cut: %+v", r.Figures)
	}
}

// TestMySQLReferencePipeline runs prove's own relay and inbox on MySQL:
// their SQL (INSERT IGNORE, ON DUPLICATE KEY UPDATE, the SELECT … FOR
// UPDATE fence check) is MySQL's own there.
func TestMySQLReferencePipeline(t *testing.T) {
	parallelUnlessRace(t)
	u := testenv.MySQLURL(t)
	rep, err := Run(context.Background(), small(WithDatabaseURL(u), WithReferenceRelay(), WithReferenceInbox(),
		WithScenarios("concurrent-relays", "sequence-gap-reorder", "poison-parking", "control-mark-before-ack", "control-non-atomic-inbox"))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, nil)
	if r, _ := rep.Result("concurrent-relays"); r.Figures.FencedWrites == 0 {
		t.Errorf("stalled reference relay was not fenced on MySQL")
	}
}

func TestSQLForMySQL(t *testing.T) {
	for in, want := range map[string]string{
		`INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING`: `INSERT IGNORE INTO t (a, b) VALUES ($1, $2)`,
		`INSERT INTO t (a, b) VALUES ($1, $2)
ON CONFLICT (a) DO UPDATE SET b = excluded.b, c = t.c + 1`: `INSERT INTO t (a, b) VALUES ($1, $2)
ON DUPLICATE KEY UPDATE b = VALUES(b), c = t.c + 1`,
		`SELECT COALESCE(CAST(p.event_id AS TEXT), '') FROM x`: `SELECT COALESCE(p.event_id, '') FROM x`,
	} {
		if got := sqlFor(driver.MySQL, in); got != want {
			t.Errorf("sqlFor(%q)\n got %q\nwant %q", in, got, want)
		}
		if got := sqlFor(driver.Postgres, in); got != in {
			t.Errorf("sqlFor changed Postgres SQL: %q", got)
		}
	}
	if got := rawSQL(driver.MySQL, `SELECT a FROM t WHERE b = $1 AND c = $2`); got != `SELECT a FROM t WHERE b = ? AND c = ?` {
		t.Errorf("rawSQL: %q", got)
	}
	if _, err := Run(context.Background(), WithDatabaseURL("sqlserver://x")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("sqlserver URL: want ErrInvalidConfig, got %v", err)
	}
}
