package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/migrate"
)

func newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade Ferry's tables (up), show their version (status), print the DDL (sql)",
	}
	var up, status storeFlags
	var statusJSON bool
	var upPartition, sqlPartition, upInbox, sqlInbox time.Duration
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "Apply pending migrations in one transaction",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := up.openForMigrate(cmd.Context(), cmd, true)
			if err != nil {
				return err
			}
			defer s.Close()
			ran, err := migrate.Up(cmd.Context(), s, up.tables(), partitionOpts(upPartition, upInbox)...)
			if err != nil {
				return relayFlagError(err)
			}
			if len(ran) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "schema is current; nothing to apply")
			}
			for _, m := range ran {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %04d_%s\n", m.Version, m.Name)
			}
			return nil
		},
	}
	up.register(upCmd)
	upCmd.Flags().DurationVar(&upPartition, "partition-outbox", 0,
		"create the outbox partitioned by created_at in ranges of this length, e.g. 24h (Postgres; only when the outbox is first created; docs/PARTITIONING.md)")
	upCmd.Flags().DurationVar(&upInbox, "partition-inbox", 0,
		"create the inbox partitioned by event_id (UUIDv7 time) in ranges of this length, e.g. 24h, plus a default partition (Postgres; only when the inbox is first created; docs/PARTITIONING.md)")
	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "Show applied and pending migrations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := status.openForMigrate(cmd.Context(), cmd, false)
			if err != nil {
				return err
			}
			defer s.Close()
			st, err := migrate.CurrentStatus(cmd.Context(), s, status.tables())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if statusJSON {
				type item struct {
					Version   int        `json:"version"`
					Name      string     `json:"name"`
					AppliedAt *time.Time `json:"applied_at,omitempty"`
				}
				doc := struct {
					Current int    `json:"current"`
					Latest  int    `json:"latest"`
					Applied []item `json:"applied"`
					Pending []item `json:"pending"`
				}{Current: st.Current, Latest: st.Latest, Applied: []item{}, Pending: []item{}}
				for _, a := range st.Applied {
					at := a.AppliedAt.UTC()
					doc.Applied = append(doc.Applied, item{Version: a.Version, Name: a.Name, AppliedAt: &at})
				}
				for _, m := range st.Pending {
					doc.Pending = append(doc.Pending, item{Version: m.Version, Name: m.Name})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(doc)
			}
			fmt.Fprintf(out, "version %d of %d\n", st.Current, st.Latest)
			for _, a := range st.Applied {
				fmt.Fprintf(out, "  applied  %04d_%s  %s\n", a.Version, a.Name, a.AppliedAt.UTC().Format("2006-01-02 15:04:05Z"))
			}
			for _, m := range st.Pending {
				fmt.Fprintf(out, "  pending  %04d_%s\n", m.Version, m.Name)
			}
			return nil
		},
	}
	status.register(statusCmd)
	statusCmd.Flags().BoolVar(&statusJSON, "json", false, "print the status as JSON")
	var sqlFlags storeFlags
	var dialect string
	sqlCmd := &cobra.Command{
		Use:   "sql",
		Short: "Print the DDL of every migration (for goose, atlas, golang-migrate)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			d := driver.Dialect(dialect)
			if d != driver.Postgres && d != driver.SQLite && d != driver.MySQL {
				return fmt.Errorf("--dialect must be postgres, mysql or sqlite, got %q", dialect)
			}
			ddl, err := migrate.SQL(d, sqlFlags.tables(), partitionOpts(sqlPartition, sqlInbox)...)
			if err != nil {
				return relayFlagError(err)
			}
			fmt.Fprint(cmd.OutOrStdout(), ddl)
			return nil
		},
	}
	sqlCmd.Flags().StringVar(&dialect, "dialect", "postgres", "postgres, mysql (MySQL 8 / MariaDB 10.6+) or sqlite")
	sqlCmd.Flags().StringVar(&sqlFlags.schema, "schema", "", "Postgres schema (MySQL: database) of Ferry's tables")
	sqlCmd.Flags().StringVar(&sqlFlags.prefix, "table-prefix", "ferry_", "prefix of Ferry's table names")
	sqlCmd.Flags().DurationVar(&sqlPartition, "partition-outbox", 0,
		"print the partitioned outbox's DDL (Postgres; partitions are made by `ferry migrate up`, the relay and cleanup)")
	sqlCmd.Flags().DurationVar(&sqlInbox, "partition-inbox", 0,
		"print the partitioned inbox's DDL with its default partition (Postgres; ranges are made by `ferry migrate up`, the inbox consumer and cleanup)")
	cmd.AddCommand(upCmd, statusCmd, sqlCmd)
	return cmd
}

// partitionOpts turns --partition-outbox and --partition-inbox into
// migrate options.
func partitionOpts(outbox, inbox time.Duration) []migrate.Option {
	var opts []migrate.Option
	if outbox != 0 {
		opts = append(opts, migrate.WithPartitionedOutbox(outbox))
	}
	if inbox != 0 {
		opts = append(opts, migrate.WithPartitionedInbox(inbox))
	}
	return opts
}
