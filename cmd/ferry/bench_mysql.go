package main

import (
	"context"
	"fmt"
	"net/url"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/migrate"
)

// benchMySQLScratch creates database name on the MySQL/MariaDB server at
// raw (a mysql:// URL), migrates Ferry's tables into it and returns a
// driver on it with at most maxConns connections, and a function that
// closes the pool and drops the database.
func benchMySQLScratch(ctx context.Context, raw, name string, maxConns int) (*databasesql.Driver, func(), error) {
	admin, err := mysql.Open(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE "+mysql.Collation); err != nil {
		_ = admin.Close()
		return nil, nil, fmt.Errorf("bench: create database %s: %w", name, err)
	}
	dropDB := func() {
		_, _ = admin.ExecContext(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS `"+name+"`")
		_ = admin.Close()
	}
	u, err := url.Parse(raw)
	if err != nil {
		dropDB()
		return nil, nil, fmt.Errorf("bench: --database-url: %w", err)
	}
	u.Path, u.RawPath = "/"+name, ""
	db, err := mysql.Open(u.String())
	if err != nil {
		dropDB()
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	drv := mysql.New(db)
	drop := func() { _ = db.Close(); dropDB() }
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		drop()
		return nil, nil, fmt.Errorf("bench: migrate: %w", err)
	}
	return drv, drop, nil
}
