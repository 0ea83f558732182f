package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/internal/statebench"
)

type benchRelayStateFlags struct {
	dbURL    string
	marked   int
	batch    int
	batches  int
	rounds   int
	payload  int
	aggs     int
	variants string
	asJSON   bool
}

func newBenchRelayStateCmd() *cobra.Command {
	f := &benchRelayStateFlags{}
	cmd := &cobra.Command{
		Use:   "relay-state",
		Short: "Where the relay's per-event state could live (#17): cost per marked event of five designs, and their claim at 1,000,000 marked rows",
		Long: `Builds, in a scratch schema of the Postgres database (dropped afterwards),
one outbox per design with Ferry's own migrations, fills it server-side with
--marked rows already marked plus a few batches of pending rows, and measures:

  a_status_update   today's mark: UPDATE status (in partial-index predicates)
  b_hot_mark        UPDATE of a column no index references (status indexes
                    dropped, claim on (shard, id)); b_hot_mark_ff50: the same
                    on a fillfactor=50 table
  c_state_table     INSERT (id, published_at, receipt) into a narrow logged table
  d_watermark       one UPDATE per shard per batch of a "sent up to" row, plus
                    an exceptions table for failed/dead rows
  e_copy_state      COPY into c's narrow table

Per design and round: the producer inserts --batches × --batch new rows (its
WAL measured), then they are marked --batch at a time, each mark in its own
transaction with synchronous_commit off like the relay's. Even batches run
under EXPLAIN (ANALYZE, WAL) for the statement's exact WAL; odd batches run
plain and are timed. Designs are interleaved (the order rotates each round)
and medians over --rounds are reported, with the load average per round.
The claim (16 shards × batch/16 rows) is EXPLAINed with --marked rows marked,
plain and, where the design has one, from a per-shard cursor.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			return runBenchRelayState(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dbURL, "database-url", "", "postgres://… (a scratch schema is created in it)")
	fl.IntVar(&f.marked, "marked", 1000000, "rows already marked in each design's outbox when its claim is measured")
	fl.IntVar(&f.batch, "batch-size", 500, "events per mark statement")
	fl.IntVar(&f.batches, "batches", 10, "mark statements per design per round (>= 2: half EXPLAINed for WAL, half timed)")
	fl.IntVar(&f.rounds, "rounds", 5, "interleaved rounds")
	fl.IntVar(&f.payload, "payload-bytes", 300, "payload size")
	fl.IntVar(&f.aggs, "aggregates", 1000, "aggregates the rows are spread over")
	fl.StringVar(&f.variants, "variants", strings.Join(statebench.Variants, ","), "designs to measure, comma-separated")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON")
	return cmd
}

func runBenchRelayState(ctx context.Context, out, progress io.Writer, f *benchRelayStateFlags) error {
	if !strings.HasPrefix(f.dbURL, "postgres") {
		return errors.New("--database-url must be a postgres:// URL (relay-state measures Postgres designs)")
	}
	var variants []string
	for _, v := range strings.Split(f.variants, ",") {
		if v = strings.TrimSpace(v); v != "" {
			variants = append(variants, v)
		}
	}
	if f.asJSON {
		progress = io.Discard
	}
	pool, drop, err := benchPGScratch(ctx, f.dbURL, "ferry_bench_"+benchRandHex(), nil)
	if err != nil {
		return err
	}
	defer drop()
	start, t0 := loadAvg(), time.Now()
	fmt.Fprintf(progress, "ferry bench relay-state: %d marked rows, batch %d × %d per round, %d rounds; load average %s\n",
		f.marked, f.batch, f.batches, f.rounds, start)
	res, err := statebench.Run(ctx, pool, statebench.Config{Marked: f.marked, Batch: f.batch, Batches: f.batches, Rounds: f.rounds,
		Payload: f.payload, Aggregates: f.aggs, Variants: variants, Progress: progress})
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			LoadStart string              `json:"load_start"`
			LoadEnd   string              `json:"load_end"`
			Seconds   float64             `json:"seconds"`
			Designs   []statebench.Result `json:"designs"`
		}{start, loadAvg(), time.Since(t0).Seconds(), res})
	}
	fmt.Fprintf(out, "%-18s %10s %9s %9s %9s %9s %10s %6s %22s %22s\n", "design", "mark µs/ev", "WAL B/ev", "recs/ev", "FPI/ev", "lsn B/ev", "insert B/ev", "HOT", "claim ms/bufs", "cursor ms/bufs")
	fmt.Fprintln(out, "(claim cells: execution ms / shared buffers, +JIT ms when JIT compiled part of it)")
	for _, r := range res {
		hot, cur := "-", "-"
		if r.HOTShare != nil {
			hot = fmt.Sprintf("%.0f%%", 100**r.HOTShare)
		}
		if r.ClaimCursor != nil {
			cur = claimCell(*r.ClaimCursor)
		}
		wal := fmt.Sprintf("%9.0f %9.2f %9.3f", r.WALBytes, r.WALRecords, r.WALFPI)
		if r.Variant == statebench.COPYState {
			wal = fmt.Sprintf("%9s %9s %9s", "n/a", "n/a", "n/a")
		}
		fmt.Fprintf(out, "%-18s %10.1f %s %9.0f %10.0f %6s %22s %22s\n", r.Variant, r.MicrosPer, wal, r.LSNBytes, r.InsertWAL, hot,
			claimCell(r.Claim), cur)
	}
	fmt.Fprintf(out, "medians of %d interleaved rounds; load average at start %s, at end %s; %.0fs\n", f.rounds, start, loadAvg(), time.Since(t0).Seconds())
	return nil
}

func claimCell(e statebench.Explain) string {
	c := fmt.Sprintf("%.2f/%d", e.ExecutionMS, e.SharedHit+e.SharedRead)
	if e.JITMS > 0 {
		c += fmt.Sprintf(" +JIT %.0f", e.JITMS)
	}
	return c
}
