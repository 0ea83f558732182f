package main

import (
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: produce (outbox write cost), relay (drain rate to a broker), consume (inbox apply rate, --recovery after a SIGKILL)",
	}
	cmd.AddCommand(newBenchProduceCmd())
	cmd.AddCommand(newBenchRelayCmd())
	cmd.AddCommand(newBenchRelayStateCmd())
	cmd.AddCommand(newBenchCleanupCmd())
	cmd.AddCommand(newBenchConsumeCmd())
	return cmd
}
