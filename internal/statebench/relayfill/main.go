// Command relayfill migrates a Postgres schema and pre-fills its outbox
// with pending events (statebench.Prefill: one INSERT … SELECT
// generate_series), for measuring `ferry relay` as its own process on a
// large backlog (docs/PERFORMANCE.md "The relay as its own process").
// Benchmark tooling, not shipped:
//
//	go run ./internal/statebench/relayfill --database-url 'postgres://…/test?search_path=rss' --events 1000000 --topic rss.events
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/migrate"
)

func main() {
	url := flag.String("database-url", "", "postgres://… (search_path selects the schema; it must exist)")
	events := flag.Int("events", 1_000_000, "pending events to write")
	topic := flag.String("topic", "rss.events", "every event's topic (NATS subject)")
	payload := flag.Int("payload-bytes", 300, "payload size")
	flag.Parse()
	if err := run(context.Background(), *url, *events, *topic, *payload); err != nil {
		fmt.Fprintln(os.Stderr, "relayfill:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, events int, topic string, payload int) error {
	if url == "" || events < 1 {
		return fmt.Errorf("--database-url is required and --events must be at least 1 (got %d)", events)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pgxv5.New(pool), ferry.Tables{}); err != nil {
		return err
	}
	start := time.Now()
	if err := statebench.Prefill(ctx, pool, ferry.Tables{}, statebench.Fill{Topic: topic, Pending: events, Aggregates: 1000, PayloadBytes: payload}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+ferry.Tables{}.Name("outbox")); err != nil {
		return err
	}
	fmt.Printf("%d pending events of %d bytes on topic %s in %.1fs\n", events, payload, topic, time.Since(start).Seconds())
	return nil
}
