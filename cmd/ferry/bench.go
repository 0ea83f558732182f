package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: produce (outbox write cost), relay (drain rate to a broker), consume (inbox apply rate, --recovery after a SIGKILL)",
	}
	cmd.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the bench run to this file (go tool pprof FILE): the relay, the reference publisher and an embedded broker; Postgres and a broker server are separate processes")
	cmd.AddCommand(newBenchProduceCmd())
	cmd.AddCommand(newBenchRelayCmd())
	cmd.AddCommand(newBenchRelayStateCmd())
	cmd.AddCommand(newBenchCleanupCmd())
	cmd.AddCommand(newBenchConsumeCmd())
	// Every bench runs under --cpuprofile, stopped and written however
	// the run ends (a cobra post-run hook is skipped after an error).
	for _, c := range cmd.Commands() {
		run := c.RunE
		if run == nil {
			continue
		}
		c.RunE = func(c *cobra.Command, args []string) error {
			if cpuProfile == "" {
				return run(c, args)
			}
			f, err := os.Create(cpuProfile)
			if err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				_ = f.Close()
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			runErr := run(c, args)
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil && runErr == nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			fmt.Fprintf(c.ErrOrStderr(), "CPU profile written to %s (go tool pprof %s)\n", cpuProfile, cpuProfile)
			return runErr
		}
	}
	return cmd
}
