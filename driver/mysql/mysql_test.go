package mysql_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestParseURL(t *testing.T) {
	cfg, err := mysql.ParseURL("mysql://u:p%40ss@db.example:3307/app?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "u" || cfg.Passwd != "p@ss" || cfg.Addr != "db.example:3307" || cfg.DBName != "app" || cfg.Timeout != 5*time.Second {
		t.Fatalf("cfg = %+v", cfg)
	}
	if !cfg.ParseTime || cfg.Loc != time.UTC || cfg.Params["time_zone"] != "'+00:00'" || !strings.HasPrefix(cfg.Collation, "utf8mb4") {
		t.Fatalf("Ferry's settings not forced: %+v", cfg)
	}
	cfg, err = mysql.ParseURL("mysql://root@localhost/test")
	if err != nil || cfg.Addr != "localhost:3306" {
		t.Fatalf("default port: %+v %v", cfg, err)
	}
	cfg, err = mysql.ParseURL("root:pw@tcp(127.0.0.1:3306)/test?parseTime=true")
	if err != nil || cfg.Addr != "127.0.0.1:3306" || cfg.DBName != "test" || cfg.Passwd != "pw" {
		t.Fatalf("DSN: %+v %v", cfg, err)
	}
}

func TestParseURLRejects(t *testing.T) {
	for in, want := range map[string]string{
		"":                                "empty",
		"mysql:///test":                   "no host",
		"mysql://root@127.0.0.1:3306":     "no database",
		"mysql://root@127.0.0.1:3306/a/b": "one database name",
		"postgres://x@y/z":                `scheme "postgres"`,
		"mysql://root@h/db?loc=Local":     "loc=UTC",
		"mysql://root@h/db?time_zone=%27SYSTEM%27": "time_zone",
		"mysql://root@h/db?charset=latin1":         "utf8mb4",
		"mysql://root@h/db?sql_mode=ANSI":          "sql_mode",
		"mysql://root@h/db?nosuch=%zz":             "parameters",
		"root@tcp(127.0.0.1:3306)":                 "DSN",
	} {
		_, err := mysql.ParseURL(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want it to mention %q", in, err, want)
		}
	}
	if _, err := mysql.Open("mysql://root@h/db?parseTime=false"); err == nil || !strings.Contains(err.Error(), "parseTime") {
		t.Errorf("parseTime=false: %v", err)
	}
	if _, err := mysql.ParseURL("mysql://u:s3cret@h:x/db"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad port: err %v must exist and not show the password", err)
	}
}

func TestOpenSessionSettings(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	var tz, mode, iso string
	// tx_isolation on MariaDB, transaction_isolation on MySQL 8.
	q := "SELECT @@session.time_zone, @@session.sql_mode, @@session.tx_isolation"
	if err := d.DB.QueryRowContext(ctx, q).Scan(&tz, &mode, &iso); err != nil {
		q = "SELECT @@session.time_zone, @@session.sql_mode, @@session.transaction_isolation"
		if err := d.DB.QueryRowContext(ctx, q).Scan(&tz, &mode, &iso); err != nil {
			t.Fatal(err)
		}
	}
	if tz != "+00:00" || !strings.Contains(mode, "STRICT_TRANS_TABLES") || iso != "READ-COMMITTED" {
		t.Fatalf("time_zone %q, sql_mode %q, isolation %q", tz, mode, iso)
	}
	var cs string
	if err := d.DB.QueryRowContext(ctx, "SELECT @@character_set_connection").Scan(&cs); err != nil || cs != "utf8mb4" {
		t.Fatalf("charset %q %v", cs, err)
	}
	var now time.Time
	if err := d.DB.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now.Location() != time.UTC || time.Since(now).Abs() > time.Minute {
		t.Fatalf("NOW() = %v, want UTC close to %v", now, time.Now().UTC())
	}
}

func TestOpenFailsWithReason(t *testing.T) {
	testenv.MySQLURL(t)
	_, err := mysql.Open("mysql://nosuchuser:pw@127.0.0.1:3306/test")
	if err == nil || !strings.Contains(err.Error(), `as "nosuchuser"`) || strings.Contains(err.Error(), ":pw@") {
		t.Fatalf("err = %v", err)
	}
}

func TestRebindAndErrors(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	if drv.Dialect() != driver.MySQL {
		t.Fatalf("dialect %q", drv.Dialect())
	}
	ex := drv.Executor()
	if _, err := ex.Exec(ctx, `CREATE TABLE "t" (id bigint PRIMARY KEY, k varchar(40) NOT NULL, v text NOT NULL, CONSTRAINT "t_k_key" UNIQUE (k))`); err != nil {
		t.Fatal(err)
	}
	// $2 before $1, $1 twice; '$1' inside a literal stays text.
	if _, err := ex.Exec(ctx, `INSERT INTO "t" (id, k, v) VALUES ($2, $1, CONCAT($1, '$1'))`, "a", 1); err != nil {
		t.Fatal(err)
	}
	var k, v string
	found, err := driver.QueryRow(ctx, ex, `SELECT k, v FROM "t" WHERE id = $1`, []any{1}, &k, &v)
	if err != nil || !found || k != "a" || v != "a$1" {
		t.Fatalf("row %q %q found=%v err=%v", k, v, found, err)
	}
	_, err = ex.Exec(ctx, `INSERT INTO "t" (id, k, v) VALUES ($1, $2, '')`, 2, "a")
	var uv *driver.UniqueViolationError
	if !errors.As(err, &uv) || !errors.Is(err, driver.ErrUniqueViolation) || uv.Constraint != "t_k_key" || !strings.Contains(uv.Detail, "Duplicate entry 'a'") {
		t.Fatalf("duplicate: %v (%+v)", err, uv)
	}
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != mysql.ErDupEntry {
		t.Fatalf("MySQL error not reachable: %v", err)
	}
	_, err = ex.Exec(ctx, `INSERT INTO "t" (id, k, v) VALUES ($1, 'b', '')`, 1)
	if !errors.As(err, &uv) || uv.Constraint != "PRIMARY" {
		t.Fatalf("duplicate primary key: %v", err)
	}
	if _, err := ex.Exec(ctx, `SELECT $2`, 1); err == nil || !strings.Contains(err.Error(), "$2 but 1 arguments") {
		t.Fatalf("missing argument: %v", err)
	}
}

// TestDeadlockIsRecognised makes InnoDB pick a victim: two transactions
// lock rows 1 and 2 in opposite order. The victim's error wraps
// driver.ErrDeadlock.
func TestDeadlockIsRecognised(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	if _, err := drv.Executor().Exec(ctx, `CREATE TABLE "t" (id int PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Executor().Exec(ctx, `INSERT INTO "t" VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	locked := make(chan struct{}, 2)
	proceed := make(chan struct{})
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := drv.Begin(ctx)
			if err != nil {
				errs[i] = err
				locked <- struct{}{}
				return
			}
			defer tx.Rollback(ctx)
			first, second := 1+i, 2-i
			if _, err := tx.Exec(ctx, `UPDATE "t" SET n = n + 1 WHERE id = $1`, first); err != nil {
				errs[i] = err
				locked <- struct{}{}
				return
			}
			locked <- struct{}{}
			<-proceed
			if _, err := tx.Exec(ctx, `UPDATE "t" SET n = n + 1 WHERE id = $1`, second); err != nil {
				errs[i] = err
				return
			}
			errs[i] = tx.Commit(ctx)
		}()
	}
	<-locked
	<-locked
	close(proceed)
	wg.Wait()
	deadlocks := 0
	for _, err := range errs {
		if errors.Is(err, driver.ErrDeadlock) {
			deadlocks++
		} else if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if deadlocks != 1 {
		t.Fatalf("errors %v: want exactly one deadlock victim", errs)
	}
}

func TestLockWaitTimeoutIsRecognised(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	drv := mysql.New(d.DB)
	if _, err := drv.Executor().Exec(ctx, `CREATE TABLE "t" (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Executor().Exec(ctx, `INSERT INTO "t" VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	holder, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT id FROM "t" WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	waiter, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Rollback(ctx)
	if _, err := waiter.Exec(ctx, `SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = waiter.Exec(ctx, `UPDATE "t" SET id = 2 WHERE id = 1`)
	if !errors.Is(err, driver.ErrLockTimeout) {
		t.Fatalf("err = %v, want driver.ErrLockTimeout", err)
	}
}
