package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Ferry: transactional outbox / inbox relay and operator tools",
		Long: `Ferry publishes committed outbox events to a broker at least once, in
per-aggregate order, and gives operators the tools to see and prove it.

Database URLs: postgres://… for Postgres, mysql://user:pass@host:port/db for
MySQL 8 / MariaDB 10.6+ (docs/MYSQL.md), sqlite:PATH (or a path ending in
.db, .sqlite or .sqlite3) for SQLite; only ferry migrate up creates a SQLite
file. Every flag can also be set as FERRY_<FLAG> in the environment, e.g.
FERRY_DATABASE_URL; a value the flag refuses is an error.`,
		Version:       version(debug.ReadBuildInfo()),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("ferry {{.Version}}\n")
	root.AddCommand(
		newMigrateCmd(),
		newDemoCmd(),
		newBenchCmd(),
		newRelayCmd(),
		newProveCmd(),
		newStatusCmd(), newDLQCmd(), newParkedCmd(), newReplayCmd(), newCleanupCmd(), newEvidenceCmd(), newEffectsCmd(),
		newConsoleCmd(), newMCPCmd(), newApprovalsCmd(),
		newVetCmd(), newContractCmd(), newCompareCmd(), newEraseCmd(), newKeysCmd(), newClaimCheckCmd(),
		newArchiveCmd(),
	)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command group (a command with
// subcommands and no action of its own) fail on an argument that names no
// subcommand — cobra only does so for the root — and print its help when
// called bare.
func refuseUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !c.HasSubCommands() || c.Run != nil || c.RunE != nil || c == c.Root() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		var names []string
		for _, s := range cmd.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		return fmt.Errorf("unknown command %q for %q (available: %s)", args[0], cmd.CommandPath(), strings.Join(names, ", "))
	}
}

// version is the module version and VCS revision from the build info:
// "v1.2.3", "(devel) commit abc123 (modified)", or "unknown".
func version(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (modified)"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " commit " + rev + modified
	}
	return v + " " + bi.GoVersion
}
