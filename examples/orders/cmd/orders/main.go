// Command orders runs the example order service in one process — SQLite,
// an embedded NATS JetStream, the relay, the billing consumer and its
// effect worker — and serves MCP on stdio: the service's own place_order
// tool (idempotency key required) next to Ferry's evidence and proposal
// tools, so an agent places an order and then verifies it.
//
//	go run ./examples/orders/cmd/orders -db /tmp/orders.db
//
// Point an MCP client at that command (see docs/AGENTS.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/docs"
	"github.com/ferryhq/ferry/examples/orders"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/opsmcp"
	"github.com/ferryhq/ferry/relay"
)

func main() {
	dbPath := flag.String("db", "orders.db", "SQLite database file (created)")
	natsDir := flag.String("nats-dir", "", "embedded JetStream store directory (default: next to -db)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dbPath, *natsDir); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbPath, natsDir string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})) // stdout is the protocol
	svc, err := orders.Open(ctx, dbPath)
	if err != nil {
		return err
	}
	defer svc.Close()
	if natsDir == "" {
		natsDir = filepath.Join(filepath.Dir(dbPath), "orders-nats")
	}
	emb, err := natsembed.Start(natsembed.WithStoreDir(natsDir))
	if err != nil {
		return err
	}
	defer emb.Close()
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: orders.Stream, Subjects: []string{orders.Topic}}); err != nil {
		return err
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := relay.New(svc.Driver, pub, relay.WithPollInterval(50*time.Millisecond), relay.WithLogger(log))
	if err != nil {
		return err
	}
	o, err := ops.New(svc.Driver, ops.WithLogger(log))
	if err != nil {
		return err
	}
	ferrySrv, err := opsmcp.New(opsmcp.Config{Ops: o, Tables: ferry.Tables{}, Guarantees: docs.Guarantees, Runbooks: docs.Operations, Logger: log})
	if err != nil {
		return err
	}
	me := opsauth.LocalUser(true).Identity
	srv := ferrySrv.MCP(&me)
	if err := svc.AddTools(srv); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- r.Run(ctx) }()
	go func() { errc <- svc.RunBilling(ctx, nc, orders.NewProvider(), log) }()
	err = srv.Run(ctx, &mcp.StdioTransport{})
	cancel()
	<-errc
	<-errc
	return err
}
