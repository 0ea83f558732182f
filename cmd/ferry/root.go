package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Ferry: transactional outbox / inbox relay and operator tools",
		Long: `Ferry publishes committed outbox events to a broker at least once, in
per-aggregate order, and gives operators the tools to see and prove it.

Database URLs: postgres://… for Postgres, sqlite:PATH (or a path ending in
.db) for SQLite. Every flag can also be set as FERRY_<FLAG> in the
environment, e.g. FERRY_DATABASE_URL.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newMigrateCmd(),
		newDemoCmd(),
		newBenchCmd(),
		newRelayCmd(),
		newProveCmd(),
		newStatusCmd(), newDLQCmd(), newParkedCmd(), newReplayCmd(), newCleanupCmd(), newEvidenceCmd(), newEffectsCmd(),
	)
	return root
}
