package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/internal/producebench"
)

func newBenchProduceCmd() *cobra.Command {
	var (
		sf          storeFlags
		clients     []int
		duration    time.Duration
		rounds      int
		notify      string
		asJSON      bool
		ref         bool
		partitioned time.Duration
	)
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "Producer cost on Postgres or MySQL: business tx alone vs + hand-written outbox INSERT vs + Ferry (sequenced)",
		Long: `Runs three transactions against --database-url (Postgres) at each client
count: (a) BEGIN; INSERT order; COMMIT, (b) the same plus a hand-written outbox
INSERT, (c) the same through Ferry's writer with per-aggregate sequencing.
Variants are interleaved for --rounds rounds and the median rate is reported,
so drift on a shared machine hits all three alike. Creates bench_orders and
Ferry's tables in the connection's search_path (Postgres) or in a scratch
database dropped afterwards (mysql://…; CPU figures are Postgres-only).

Each measurement also reports CPU per transaction: the benchmark process's
own, and — when Postgres runs on this host (Linux) — the whole Postgres
instance's, so on a CPU-bound machine the table shows where a difference in
throughput comes from. The server figure is only meaningful when nothing else
uses that instance meanwhile.

--reference adds variants that decompose the gap between (b) and (c)
(docs/PERFORMANCE.md): x_ferry_shape_no_seq (Ferry's statement shape, constant
sequence), x_on_conflict_floor (sequence 1 with ON CONFLICT DO NOTHING: the
floor for one-statement schemes that detect a concurrent writer), and
x_outbox_max_seq (allocation from max(aggregate_seq)+1 of the outbox, no
sequence row).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			ctx := cmd.Context()
			if sf.url == "" {
				return fmt.Errorf("no database: set --database-url or FERRY_DATABASE_URL (Postgres)")
			}
			// r measures one variant; Postgres and MySQL have their own runner.
			var r interface {
				Measure(ctx context.Context, v producebench.Variant, clients int, d time.Duration) (producebench.Result, error)
			}
			if strings.HasPrefix(sf.url, "mysql://") {
				if ref {
					return fmt.Errorf("--reference: the reference variants are Postgres statements; not offered on mysql://")
				}
				// A scratch database on the server, dropped afterwards.
				drv, drop, err := benchMySQLScratch(ctx, sf.url, "ferry_bench_"+benchRandHex(), slices.Max(clients)+4)
				if err != nil {
					return err
				}
				defer drop()
				if err := producebench.SetupMySQL(ctx, drv.DB(), sf.tables()); err != nil {
					return err
				}
				mr, err := producebench.NewMySQL(drv.DB(), sf.tables())
				if err != nil {
					return err
				}
				r = mr
			} else {
				cfg, err := pgxpool.ParseConfig(sf.url)
				if err != nil {
					return fmt.Errorf("database-url: %w", err)
				}
				cfg.MaxConns = int32(slices.Max(clients) + 4)
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					return err
				}
				defer pool.Close()
				if err := producebench.Setup(ctx, pool, sf.tables(), partitionOpts(partitioned, 0)...); err != nil {
					return relayFlagError(err)
				}
				pr, err := producebench.New(pool, sf.tables(), notify)
				if err != nil {
					return err
				}
				r = pr
			}
			variants := slices.Clone(producebench.Variants)
			if ref {
				variants = append(variants, producebench.ReferenceVariants...)
			}
			type row struct {
				Clients int                              `json:"clients"`
				Rates   map[producebench.Variant]float64 `json:"median_tx_per_sec"`
				Ratio   float64                          `json:"c_over_b"`
				// Median CPU per transaction in microseconds; absent when
				// it could not be measured.
				ServerCPU map[producebench.Variant]float64 `json:"median_server_cpu_us_per_tx,omitempty"`
				ClientCPU map[producebench.Variant]float64 `json:"median_client_cpu_us_per_tx,omitempty"`
			}
			var out []row
			for _, c := range clients {
				rates, server, client := map[producebench.Variant][]float64{}, map[producebench.Variant][]float64{}, map[producebench.Variant][]float64{}
				for range rounds {
					for _, v := range variants {
						res, err := r.Measure(ctx, v, c, duration)
						if err != nil {
							return err
						}
						rates[v] = append(rates[v], res.TxPerSec)
						if res.ServerCPUPerTx > 0 {
							server[v] = append(server[v], float64(res.ServerCPUPerTx)/float64(time.Microsecond))
						}
						if res.ClientCPUPerTx > 0 {
							client[v] = append(client[v], float64(res.ClientCPUPerTx)/float64(time.Microsecond))
						}
					}
				}
				rw := row{Clients: c, Rates: map[producebench.Variant]float64{}}
				for v, s := range rates {
					rw.Rates[v] = median(s)
				}
				rw.ServerCPU, rw.ClientCPU = medians(server, len(variants)), medians(client, len(variants))
				rw.Ratio = rw.Rates[producebench.FerrySequenced] / rw.Rates[producebench.HandWritten]
				out = append(out, rw)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			w := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "clients\t(a) business tx/s\t(b) + hand outbox tx/s\t(c) + ferry tx/s\t(c)/(b)\t")
			for _, rw := range out {
				fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.3f\t\n", rw.Clients, rw.Rates[producebench.BusinessOnly],
					rw.Rates[producebench.HandWritten], rw.Rates[producebench.FerrySequenced], rw.Ratio)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			cpu := func(m map[producebench.Variant]float64, v producebench.Variant) string {
				if m == nil {
					return "n/a"
				}
				return fmt.Sprintf("%.0f", m[v])
			}
			fmt.Fprintln(w, "\nmedian per transaction (server = the local Postgres instance's CPU, n/a when not measurable):")
			tw = tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "clients\tvariant\ttx/s\tvs (b)\tserver CPU µs\tclient CPU µs\t")
			for _, rw := range out {
				for _, v := range variants {
					fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3f\t%s\t%s\t\n", rw.Clients, v, rw.Rates[v], rw.Rates[v]/rw.Rates[producebench.HandWritten],
						cpu(rw.ServerCPU, v), cpu(rw.ClientCPU, v))
				}
			}
			return tw.Flush()
		},
	}
	sf.register(cmd)
	cmd.Flags().IntSliceVar(&clients, "clients", []int{1, 8, 32}, "concurrent clients")
	cmd.Flags().DurationVar(&duration, "duration", 3*time.Second, "duration of one measurement")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "interleaved rounds per client count (median reported)")
	cmd.Flags().StringVar(&notify, "notify", "", "also NOTIFY this channel from Ferry's insert (measures NOTIFY cost)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&ref, "reference", false, "also run the reference variants that decompose the (b)→(c) gap")
	cmd.Flags().DurationVar(&partitioned, "partition-outbox", 0, "Postgres: create the outbox partitioned in ranges of this length (migrate --partition-outbox; only when the tables are new)")
	return cmd
}

func median(s []float64) float64 {
	slices.Sort(s)
	return s[len(s)/2]
}

// medians returns the median of each variant's samples, or nil unless all
// n variants have samples (a CPU clock that could not be read).
func medians(samples map[producebench.Variant][]float64, n int) map[producebench.Variant]float64 {
	if len(samples) != n {
		return nil
	}
	out := make(map[producebench.Variant]float64, n)
	for v, s := range samples {
		out[v] = median(s)
	}
	return out
}
