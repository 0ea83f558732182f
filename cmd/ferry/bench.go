package main

import (
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: produce (outbox write cost on Postgres)",
	}
	cmd.AddCommand(newBenchProduceCmd())
	cmd.AddCommand(newBenchRelayCmd())
	cmd.AddCommand(newBenchConsumeCmd())
	return cmd
}
