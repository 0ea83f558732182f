package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/prove"
	"github.com/ferryhq/ferry/relay"
)

func newProveCmd() *cobra.Command {
	var (
		scenarios                    []string
		list, asJSON, refRel, sentWM bool
		seed                         int64
		events, aggs, tenants        int
		producers, shardPipeline     int
		duration, partInbox, limit   time.Duration
		postgres, brokerURL          string
		soak                         prove.SoakOptions
		matrix                       bool
		stacks                       []string
		matrixURLs                   prove.MatrixOptions
	)
	cmd := &cobra.Command{
		Use:   "prove",
		Short: "Run the crash matrix: inject faults, check lost/phantom/duplicate/order from ground truth",
		Long: `prove runs the whole pipeline (producer → outbox → relay → broker → inbox
consumer → effect ledger → fake provider) once per scenario under injected
faults, and reports figures measured from the databases, the broker's stream
and the provider's own books — never from what the components say.

Negative controls (control-*) are deliberately broken pipelines: they must
show violations. Exit status is 1 when a real scenario shows a violation or
a control shows none. See docs/PROVE.md for every figure.

Embedded by default (SQLite in a temp dir + in-process NATS JetStream);
--database-url and --broker point it at your own servers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			if list {
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 2, 2, ' ', 0)
				for _, s := range prove.Scenarios() {
					kind := "scenario"
					if s.Control {
						kind = "control"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, kind, s.Description)
				}
				return tw.Flush()
			}
			if err := checkProveModes(cmd, soak.Period > 0, matrix); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("prove: locate own executable: %w", err)
			}
			opts := []prove.Option{
				prove.WithSeed(seed), prove.WithEvents(events), prove.WithAggregates(aggs), prove.WithTenants(tenants),
				prove.WithProducers(producers), prove.WithDuration(duration), prove.WithScenarioLimit(limit), prove.WithProgress(cmd.ErrOrStderr()),
				prove.WithWorkerCommand(exe, "prove", "worker"),
			}
			for _, s := range scenarios {
				for _, n := range strings.Split(s, ",") {
					if n = strings.TrimSpace(n); n != "" {
						opts = append(opts, prove.WithScenarios(n))
					}
				}
			}
			if postgres != "" {
				if d, _, err := parseDatabaseURL(postgres); err != nil {
					return err
				} else if (d != driver.Postgres && d != driver.MySQL) || (d == driver.MySQL && !strings.HasPrefix(postgres, "mysql://")) {
					return fmt.Errorf("--database-url: prove runs on a fresh SQLite file of its own by default; it takes only postgres:// or mysql://user:pass@host:port/db URLs, got %q", redactURL(postgres))
				}
				opts = append(opts, prove.WithDatabaseURL(postgres))
			}
			if brokerURL != "" {
				opts = append(opts, prove.WithBroker(brokerURL))
			}
			if refRel {
				opts = append(opts, prove.WithReferenceRelay())
			}
			if sentWM {
				opts = append(opts, prove.WithSentWatermark())
			}
			if shardPipeline != 0 {
				opts = append(opts, prove.WithShardPipeline(shardPipeline))
			}
			if partInbox != 0 {
				opts = append(opts, prove.WithPartitionedInbox(partInbox))
			}
			if soak.Period > 0 {
				return runSoakCmd(cmd, soak, asJSON, opts)
			}
			if matrix {
				for _, s := range stacks {
					for _, n := range strings.Split(s, ",") {
						if n = strings.TrimSpace(n); n != "" {
							matrixURLs.Stacks = append(matrixURLs.Stacks, n)
						}
					}
				}
				return runMatrixCmd(cmd, matrixURLs, asJSON, opts)
			}
			rep, err := prove.Run(cmd.Context(), opts...)
			if err != nil {
				return err
			}
			return writeProveReport(cmd, rep, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&scenarios, "scenario", nil, "scenario(s) to run, repeatable or comma-separated (default: all; see --list)")
	f.BoolVar(&list, "list", false, "list scenarios and exit")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.Int64Var(&seed, "seed", 1, "workload and fault-plan seed; the same seed reproduces the deterministic figures")
	f.IntVar(&events, "events", 400, "events planned per scenario")
	f.IntVar(&aggs, "aggregates", 40, "orders per tenant")
	f.IntVar(&tenants, "tenants", 3, "tenants (sharing aggregate ids)")
	f.IntVar(&producers, "producers", 4, "concurrent producers")
	f.DurationVar(&duration, "duration", 60*time.Second, "longest a scenario may take to settle")
	f.DurationVar(&limit, "scenario-limit", 0, "hard limit of one scenario, setup to verdict (1s..24h; default 4 × --duration + 3m): a scenario still running is stopped, its goroutines' stacks go to stderr and its result is an error")
	f.StringVar(&postgres, "database-url", "", "postgres://… or mysql://user:pass@host:port/db (default: SQLite in a temp dir); each scenario uses a fresh schema (MySQL: a fresh database, so the user needs CREATE and DROP) and touches nothing else")
	f.StringVar(&postgres, "postgres", "", "old name of --database-url")
	_ = f.MarkDeprecated("postgres", "use --database-url")
	f.StringVar(&brokerURL, "broker", "", "broker: nats://host:port, nats-cluster (prove's own 3-node JetStream cluster, R3 streams), kafka://kfake, kafka://host:port[,…], amqp://user:pass@host:port/ (default: embedded NATS)")
	f.BoolVar(&refRel, "reference-relay", false, "use prove's reference relay instead of package relay")
	f.DurationVar(&partInbox, "partition-inbox", 0, "every scenario's inbox range-partitioned by event id in intervals of this length (migrate --partition-inbox; Postgres only)")
	f.IntVar(&shardPipeline, "shard-pipeline", 0, fmt.Sprintf("run package relay with up to this many batches of a shard in flight (2..%d; relay.WithShardPipeline; Postgres, status design)", relay.MaxShardPipeline))
	f.BoolVar(&sentWM, "sent-watermark", false, "run package relay in the watermark design (relay.WithSentWatermark; Postgres only) and read row states as that design defines them")
	f.DurationVar(&soak.Period, "soak", 0, "run a bounded soak instead of the scenarios: producers at a steady rate for this long (10s..24h) with faults on a schedule, figures per interval, RSS and goroutines of every process, then the checker")
	f.DurationVar(&soak.Interval, "soak-interval", 0, "with --soak: one row of figures per interval (default 1m, or the period when shorter)")
	f.DurationVar(&soak.FaultEvery, "soak-fault-every", 0, "with --soak: the gap from one fault's end to the next fault (default 30s, or a quarter of the period when shorter)")
	f.IntVar(&soak.Rate, "soak-rate", 0, "with --soak: producer transactions per second, across all producers (default 20)")
	f.BoolVar(&matrix, "matrix", false, "run the scenarios on every stack of the grid {sqlite, postgres, mysql} × {nats, nats-cluster, kafka (kfake), rabbitmq} and print one scenario × stack table")
	f.StringSliceVar(&stacks, "stacks", nil, "with --matrix: the stacks to run, comma-separated, e.g. sqlite+nats,postgres+kafka (default: all; names: "+strings.Join(prove.MatrixStackNames(), ",")+")")
	f.StringVar(&matrixURLs.PostgresURL, "matrix-postgres", "", "with --matrix: postgres://… for the postgres column (without it the column is not applicable)")
	f.StringVar(&matrixURLs.MySQLURL, "matrix-mysql", "", "with --matrix: mysql://user:pass@host:port/db for the mysql column (without it the column is not applicable)")
	f.StringVar(&matrixURLs.RabbitMQURL, "matrix-rabbitmq", "", "with --matrix: amqp://user:pass@host:port/ for the rabbitmq column (without it the column is not applicable)")
	cmd.AddCommand(&cobra.Command{
		Use:    "worker",
		Short:  "internal: run a prove worker subprocess (started by prove itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := prove.RunWorker(cmd.Context())
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	})
	return cmd
}

// checkProveModes refuses flags that do not apply to the chosen mode
// (scenarios, --soak or --matrix), naming them.
func checkProveModes(cmd *cobra.Command, soak, matrix bool) error {
	changed := func(names ...string) string {
		for _, n := range names {
			if cmd.Flags().Changed(n) {
				return "--" + n
			}
		}
		return ""
	}
	switch {
	case soak && matrix:
		return fmt.Errorf("--soak and --matrix: choose one")
	case soak && changed("scenario", "events") != "":
		return fmt.Errorf("%s does not apply to --soak: the soak runs one pipeline of --soak-rate × --soak transactions", changed("scenario", "events"))
	case !soak && changed("soak-interval", "soak-fault-every", "soak-rate") != "":
		return fmt.Errorf("%s needs --soak", changed("soak-interval", "soak-fault-every", "soak-rate"))
	case matrix && changed("sent-watermark", "partition-inbox", "shard-pipeline") != "":
		return fmt.Errorf("%s does not apply to --matrix: it is Postgres-only; run it with --database-url postgres://… instead", changed("sent-watermark", "partition-inbox", "shard-pipeline"))
	case matrix && changed("database-url", "postgres", "broker") != "":
		return fmt.Errorf("%s does not apply to --matrix: it sets the database and broker per stack; use --stacks and --matrix-postgres, --matrix-mysql, --matrix-rabbitmq", changed("database-url", "postgres", "broker"))
	case !matrix && changed("stacks", "matrix-postgres", "matrix-mysql", "matrix-rabbitmq") != "":
		return fmt.Errorf("%s needs --matrix", changed("stacks", "matrix-postgres", "matrix-mysql", "matrix-rabbitmq"))
	}
	return nil
}

func runSoakCmd(cmd *cobra.Command, so prove.SoakOptions, asJSON bool, opts []prove.Option) error {
	rep, err := prove.RunSoak(cmd.Context(), so, opts...)
	if err != nil {
		return err
	}
	return writeProveReport(cmd, rep, asJSON)
}

func runMatrixCmd(cmd *cobra.Command, mo prove.MatrixOptions, asJSON bool, opts []prove.Option) error {
	mo.Progress = cmd.ErrOrStderr()
	m, err := prove.RunMatrix(cmd.Context(), mo, opts...)
	if err != nil {
		return err
	}
	return writeProveReport(cmd, m, asJSON)
}

// proveReport is what the scenario run, the soak and the matrix print.
type proveReport interface {
	WriteJSON(io.Writer) error
	WriteTable(io.Writer) error
	Failed() bool
}

// writeProveReport prints r and turns a failed run into exit code 1.
func writeProveReport(cmd *cobra.Command, r proveReport, asJSON bool) error {
	var err error
	if asJSON {
		err = r.WriteJSON(cmd.OutOrStdout())
	} else {
		err = r.WriteTable(cmd.OutOrStdout())
	}
	if err != nil {
		return err
	}
	if r.Failed() {
		return exitCodeError{code: 1}
	}
	return nil
}
