package migrate_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

func TestMySQLMigrationsRender(t *testing.T) {
	pg, err := migrate.Load(driver.Postgres, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrate.Load(driver.MySQL, ferry.Tables{Prefix: "app_"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != len(pg) {
		t.Fatalf("%d MySQL migrations, %d Postgres: every migration needs both dialects", len(ms), len(pg))
	}
	for i, m := range ms {
		if m.Version != pg[i].Version || m.Name != pg[i].Name {
			t.Fatalf("MySQL %04d_%s, Postgres %04d_%s", m.Version, m.Name, pg[i].Version, pg[i].Name)
		}
		var code strings.Builder
		for _, line := range strings.Split(m.SQL, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				code.WriteString(line + "\n")
			}
		}
		if c := code.String(); strings.Contains(c, `"`) || strings.Contains(c, "{{") || strings.Contains(c, "ferry_") {
			t.Fatalf("%04d: double quote, template or default prefix left:\n%s", m.Version, m.SQL)
		}
	}
	if !strings.Contains(ms[0].SQL, "CREATE TABLE `app_outbox`") {
		t.Fatalf("prefix not applied:\n%.300s", ms[0].SQL)
	}
	ddl, err := migrate.SQL(driver.MySQL, ferry.Tables{Schema: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ddl, "CREATE DATABASE IF NOT EXISTS `billing`") || !strings.Contains(ddl, "CREATE TABLE `billing`.`ferry_outbox`") {
		t.Fatalf("DDL:\n%.400s", ddl)
	}
}

// mysqlTables lists the tables of the database the driver is on.
func mysqlTables(t *testing.T, d *testenv.MySQLDatabase, schema string) []string {
	t.Helper()
	rows, err := d.DB.Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY table_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

func TestMySQLUpTwiceAndStatus(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	latest, err := migrate.Load(driver.MySQL, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := migrate.CurrentStatus(ctx, drv, ferry.Tables{})
	if err != nil || st.Current != 0 || len(st.Pending) != len(latest) {
		t.Fatalf("fresh status %+v, %v", st, err)
	}
	ran, err := migrate.Up(ctx, drv, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != len(latest) {
		t.Fatalf("first up applied %d, want %d", len(ran), len(latest))
	}
	if ran, err = migrate.Up(ctx, drv, ferry.Tables{}); err != nil || len(ran) != 0 {
		t.Fatalf("second up applied %d, %v; want 0", len(ran), err)
	}
	st, err = migrate.CurrentStatus(ctx, drv, ferry.Tables{})
	if err != nil || st.Current != latest[len(latest)-1].Version || len(st.Pending) != 0 || len(st.Applied) != len(latest) {
		t.Fatalf("status %+v, %v", st, err)
	}
	got := strings.Join(mysqlTables(t, d, d.Name), ",")
	for _, want := range []string{"ferry_outbox", "ferry_aggregate_seq", "ferry_relay_leases", "ferry_inbox", "ferry_inbox_cursor", "ferry_inbox_parked", "ferry_effects", "ferry_command_keys", "ferry_ops_audit", "ferry_ops_settings", "ferry_ops_approvals", "ferry_migrations"} {
		if !strings.Contains(got, want) {
			t.Fatalf("table %s missing from %s", want, got)
		}
	}
	// The partial unique index's replacement: one open row per key, any
	// number of resolved ones.
	ins := "INSERT INTO ferry_inbox_parked (consumer, reason, park_key, first_seen, last_seen, resolved_at) VALUES ('c', 'poison', 'k', NOW(6), NOW(6), ?)"
	for i, resolved := range []any{"2026-01-01 00:00:00", "2026-01-02 00:00:00", nil} {
		if _, err := d.DB.Exec(ins, resolved); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
	}
	if _, err := d.DB.Exec(ins, nil); err == nil || !strings.Contains(err.Error(), "1062") {
		t.Fatalf("second open row for one key: %v, want a duplicate key error", err)
	}
	// Binary collation: keys differing only in case are distinct, as on Postgres.
	seq := "INSERT INTO ferry_aggregate_seq (tenant_id, aggregate_type, aggregate_id, last_seq) VALUES ('t', 'a', ?, 1)"
	if _, err := d.DB.Exec(seq, "Id"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB.Exec(seq, "id"); err != nil {
		t.Fatalf("case-different aggregate id rejected: %v", err)
	}
}

// TestMySQLUpRecoversHalfAppliedMigration: a crash after some of a
// migration's statements (MySQL commits DDL one statement at a time) leaves
// it unrecorded; the next Up completes it.
func TestMySQLUpRecoversHalfAppliedMigration(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	// Undo part of 0005 and forget 0005 and later, as a crash in 0005 would leave it.
	for _, q := range []string{
		"DROP INDEX ferry_inbox_parked_replay_idx ON ferry_inbox_parked",
		"ALTER TABLE ferry_inbox_parked DROP COLUMN replay_audit_id",
		"DELETE FROM ferry_migrations WHERE version >= 5",
	} {
		if _, err := d.DB.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	ran, err := migrate.Up(ctx, drv, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) == 0 || ran[0].Version != 5 {
		t.Fatalf("re-run applied %v", ran)
	}
	var n int
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'ferry_inbox_parked' AND column_name = 'replay_audit_id'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("column not restored: %d %v", n, err)
	}
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM ferry_ops_settings`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("settings rows %d %v, want 2", n, err)
	}
}

func TestMySQLUpWithSchemaAndPrefix(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	schema := d.Name + "_b"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS `" + schema + "`") })
	tables := ferry.Tables{Schema: schema, Prefix: "app_"}
	if _, err := migrate.Up(ctx, mysql.New(d.DB), tables); err != nil {
		t.Fatal(err)
	}
	got := mysqlTables(t, d, schema)
	if len(got) == 0 || !strings.Contains(strings.Join(got, ","), "app_outbox") || len(mysqlTables(t, d, d.Name)) != 0 {
		t.Fatalf("tables in %s: %v; in %s: %v", schema, got, d.Name, mysqlTables(t, d, d.Name))
	}
}

func TestMySQLConcurrentUpGoroutines(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	latest, _ := migrate.Load(driver.MySQL, ferry.Tables{})
	const workers = 8
	var wg sync.WaitGroup
	counts := make([]int, workers)
	errs := make([]error, workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := d.OpenSQL(t)
			ran, err := migrate.Up(ctx, mysql.New(db), ferry.Tables{})
			counts[g], errs[g] = len(ran), err
		}()
	}
	wg.Wait()
	appliers := 0
	for g := range workers {
		if errs[g] != nil {
			t.Fatalf("worker %d: %v", g, errs[g])
		}
		switch counts[g] {
		case len(latest):
			appliers++
		case 0:
		default:
			t.Fatalf("worker %d applied %d migrations", g, counts[g])
		}
	}
	if appliers != 1 {
		t.Fatalf("%d workers applied the migrations, want 1", appliers)
	}
}

const mysqlChildEnv = "FERRY_MIGRATE_CHILD_MYSQL_URL"

// TestMySQLMigrateUpChild is the child process of TestMySQLConcurrentUpProcesses.
func TestMySQLMigrateUpChild(t *testing.T) {
	u := os.Getenv(mysqlChildEnv)
	if u == "" {
		t.Skip("child process of TestMySQLConcurrentUpProcesses")
	}
	db, err := mysql.Open(u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ran, err := migrate.Up(context.Background(), mysql.New(db), ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("applied=%d\n", len(ran))
}

func TestMySQLConcurrentUpProcesses(t *testing.T) {
	const workers, rounds = 4, 3
	latest, _ := migrate.Load(driver.MySQL, ferry.Tables{})
	for round := range rounds {
		d := testenv.NewMySQLDatabase(t)
		var wg sync.WaitGroup
		outs := make([][]byte, workers)
		errs := make([]error, workers)
		for g := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(os.Args[0], "-test.run=^TestMySQLMigrateUpChild$", "-test.v")
				cmd.Env = append(os.Environ(), mysqlChildEnv+"="+d.URL)
				outs[g], errs[g] = cmd.CombinedOutput()
			}()
		}
		wg.Wait()
		appliers := 0
		for g := range workers {
			if errs[g] != nil {
				t.Fatalf("round %d, process %d: %v\n%s", round, g, errs[g], outs[g])
			}
			switch {
			case strings.Contains(string(outs[g]), fmt.Sprintf("applied=%d\n", len(latest))):
				appliers++
			case !strings.Contains(string(outs[g]), "applied=0\n"):
				t.Fatalf("round %d, process %d:\n%s", round, g, outs[g])
			}
		}
		if appliers != 1 {
			t.Fatalf("round %d: %d processes applied, want 1", round, appliers)
		}
	}
}
