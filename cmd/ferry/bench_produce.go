package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/internal/producebench"
)

func newBenchProduceCmd() *cobra.Command {
	var (
		sf       storeFlags
		clients  []int
		duration time.Duration
		rounds   int
		notify   string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "Producer cost on Postgres: business tx alone vs + hand-written outbox INSERT vs + Ferry (sequenced)",
		Long: `Runs three transactions against --database-url (Postgres) at each client
count: (a) BEGIN; INSERT order; COMMIT, (b) the same plus a hand-written outbox
INSERT, (c) the same through Ferry's writer with per-aggregate sequencing.
Variants are interleaved for --rounds rounds and the median rate is reported,
so drift on a shared machine hits all three alike. Creates bench_orders and
Ferry's tables in the connection's search_path.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			applyEnv(cmd)
			ctx := cmd.Context()
			if sf.url == "" {
				return fmt.Errorf("no database: set --database-url or FERRY_DATABASE_URL (Postgres)")
			}
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
			if err := producebench.Setup(ctx, pool, sf.tables()); err != nil {
				return err
			}
			r, err := producebench.New(pool, sf.tables(), notify)
			if err != nil {
				return err
			}
			type row struct {
				Clients int                              `json:"clients"`
				Rates   map[producebench.Variant]float64 `json:"median_tx_per_sec"`
				Ratio   float64                          `json:"c_over_b"`
			}
			var out []row
			for _, c := range clients {
				samples := map[producebench.Variant][]float64{}
				for range rounds {
					for _, v := range producebench.Variants {
						res, err := r.Measure(ctx, v, c, duration)
						if err != nil {
							return err
						}
						samples[v] = append(samples[v], res.TxPerSec)
					}
				}
				rw := row{Clients: c, Rates: map[producebench.Variant]float64{}}
				for v, s := range samples {
					slices.Sort(s)
					rw.Rates[v] = s[len(s)/2]
				}
				rw.Ratio = rw.Rates[producebench.FerrySequenced] / rw.Rates[producebench.HandWritten]
				out = append(out, rw)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 2, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "clients\t(a) business tx/s\t(b) + hand outbox tx/s\t(c) + ferry tx/s\t(c)/(b)\t")
			for _, rw := range out {
				fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.3f\t\n", rw.Clients, rw.Rates[producebench.BusinessOnly],
					rw.Rates[producebench.HandWritten], rw.Rates[producebench.FerrySequenced], rw.Ratio)
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
	return cmd
}
