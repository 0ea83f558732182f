// Command adopt runs the adoption example (package examples/adopt): the
// same orders through the old dual write and through the outbox with the
// relay in shadow mode, under injected faults, and prints what the shadow
// comparison found.
//
//	go run ./examples/adopt/cmd/adopt [-orders 500] [-cut 0.05] [-seed 19] [-relay-crashes 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/ferryhq/ferry/examples/adopt"
)

func main() {
	cfg := adopt.Config{}
	flag.IntVar(&cfg.Orders, "orders", 500, "orders placed on both paths")
	flag.Float64Var(&cfg.CutRate, "cut", 0.05, "share of old-path publishes cut between commit and publish")
	flag.Uint64Var(&cfg.Seed, "seed", 19, "seed of the cut decisions")
	flag.IntVar(&cfg.RelayCrashes, "relay-crashes", 3, "relay crashes between publish and mark")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dir, err := os.MkdirTemp("", "ferry-adopt-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "adopt:", err)
		os.Exit(1)
	}
	cfg.Dir = dir
	res, err := adopt.Run(ctx, cfg)
	_ = os.RemoveAll(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(adopt.Figure(res))
}
