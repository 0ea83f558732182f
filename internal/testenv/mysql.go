package testenv

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/driver/mysql"
)

// DefaultMySQLURL is the development machine's MariaDB.
const DefaultMySQLURL = "mysql://root@127.0.0.1:3306/test"

// MySQL is the MySQL/MariaDB server, for Announce.
var MySQL = Server{Name: "MySQL/MariaDB", Env: "FERRY_TEST_MYSQL_URL", Default: DefaultMySQLURL}

// MySQLURL returns the MySQL/MariaDB URL (FERRY_TEST_MYSQL_URL, default
// DefaultMySQLURL) after checking a connection works; it skips or fails t
// otherwise.
func MySQLURL(t testing.TB) string {
	t.Helper()
	u := URL(MySQL.Env, DefaultMySQLURL)
	db, err := mysql.Open(u)
	if err == nil {
		err = db.Close()
	}
	if err != nil {
		Unavailable(t, "MySQL/MariaDB at %s (%s): %v", redact(u), MySQL.Env, err)
	}
	return u
}

// MySQLDatabase is an isolated database for one test (MySQL's schema).
type MySQLDatabase struct {
	// URL connects to Name (a mysql:// URL when the server's was one).
	URL  string
	Name string
	// DB is a pool on the database opened with mysql.Open; closed at cleanup.
	DB *sql.DB
}

// NewMySQLDatabase creates a uniquely named database on the server at
// MySQLURL, a pool on it (mysql.Open), and registers cleanup that closes
// the pool and drops the database.
func NewMySQLDatabase(t testing.TB) *MySQLDatabase {
	t.Helper()
	base := MySQLURL(t)
	name := "ferry_test_" + randHex(6)
	admin, err := mysql.Open(base)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE "+mysql.Collation); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	u, err := mysqlURLWithDatabase(base, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db, err := mysql.Open(u)
	if err != nil {
		t.Fatalf("testenv: connect database: %v", err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		admin, err := mysql.Open(base)
		if err != nil {
			t.Errorf("testenv: cleanup connect: %v", err)
			return
		}
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	return &MySQLDatabase{URL: u, Name: name, DB: db}
}

// OpenSQL opens another pool on the database (mysql.Open); closed at cleanup.
func (d *MySQLDatabase) OpenSQL(t testing.TB) *sql.DB {
	t.Helper()
	db, err := mysql.Open(d.URL)
	if err != nil {
		t.Fatalf("testenv: open sql: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// mysqlURLWithDatabase replaces the database of a mysql:// URL or of a
// go-sql-driver DSN.
func mysqlURLWithDatabase(base, name string) (string, error) {
	if strings.Contains(base, "://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	cfg, err := mysql.ParseURL(base)
	if err != nil {
		return "", err
	}
	cfg.DBName = name
	return cfg.FormatDSN(), nil
}
