package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

type benchCleanupFlags struct {
	dbURL   string
	table   string // --table: outbox or inbox
	rows    int
	payload int
	rounds  int
	asJSON  bool
}

func newBenchCleanupCmd() *cobra.Command {
	f := &benchCleanupFlags{}
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Cleanup of a day's sent rows (or inbox claims): batched DELETE on a plain table against dropping the partition of a partitioned one (#17)",
		Long: `For each mode, in a scratch schema of the Postgres database (dropped
afterwards): fills the outbox server-side with --rows sent rows, then runs
ferry's cleanup (7-day retention; the rows were created and published 8 days
ago, in their own partition on the partitioned outbox) while a producer
commits one event every 2 ms, and reports: the cleanup's wall time, the WAL
it wrote, the outbox's total size (heap + indexes + TOAST) before and after,
the VACUUM the cleanup leaves for later (its time and WAL), and the
producer's commit latency p50 / p99 / max during the cleanup (a long lock
shows there).

  delete      a plain outbox: ops.Cleanup's batched DELETE (1,000 rows per
              short transaction)
  partition   the outbox partitioned by day (migrate.WithPartitionedOutbox):
              the partition holding the rows is checked, detached and dropped

--table inbox does the same for the inbox: --rows claims of 5 consumers,
applied 8 days ago, of events whose UUIDv7 ids are of that day (the range
partition of migrate.WithPartitionedInbox), while a consumer claims one new
event every 2 ms; the partition's drop is guarded (no claim in it applied
inside the retention).

Modes alternate for --rounds rounds; medians are printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			if !strings.HasPrefix(f.dbURL, "postgres") {
				return errors.New("--database-url: bench cleanup runs on Postgres (postgres://…)")
			}
			if f.table != "outbox" && f.table != "inbox" {
				return fmt.Errorf("--table must be outbox or inbox, not %q", f.table)
			}
			if f.rows < 1 || f.rows > 50_000_000 || f.payload < 2 || f.rounds < 1 || f.rounds > 20 {
				return errors.New("--rows must be in 1..50000000, --payload-bytes >= 2, --rounds in 1..20")
			}
			return runBenchCleanup(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	cmd.Flags().StringVar(&f.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "Postgres URL (a scratch schema is created in it)")
	cmd.Flags().StringVar(&f.table, "table", "outbox", "the table cleaned up: outbox (sent rows) or inbox (claims)")
	cmd.Flags().IntVar(&f.rows, "rows", 1_000_000, "sent rows (inbox: claims) to clean up")
	cmd.Flags().IntVar(&f.payload, "payload-bytes", 300, "payload size")
	cmd.Flags().IntVar(&f.rounds, "rounds", 1, "interleaved rounds of both modes")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print every round as JSON")
	return cmd
}

// cleanupRound is one mode's figures in one round.
type cleanupRound struct {
	Table           string  `json:"table"`
	Mode            string  `json:"mode"`
	Rows            int     `json:"rows"`
	PrefillSeconds  float64 `json:"prefill_seconds"`
	CleanupSeconds  float64 `json:"cleanup_seconds"`
	CleanupWALBytes int64   `json:"cleanup_wal_bytes"`
	SizeBeforeBytes int64   `json:"size_before_bytes"`
	SizeAfterBytes  int64   `json:"size_after_bytes"`
	VacuumSeconds   float64 `json:"vacuum_after_seconds"`
	VacuumWALBytes  int64   `json:"vacuum_after_wal_bytes"`
	ProducerCommits int     `json:"producer_commits"`
	ProducerP50ms   float64 `json:"producer_p50_ms"`
	ProducerP99ms   float64 `json:"producer_p99_ms"`
	ProducerMaxms   float64 `json:"producer_max_ms"`
	Removed         int64   `json:"rows_removed"`
	// ExclusiveMillis: partition mode, the drop's exclusive lock on the
	// outbox (lock wait included).
	ExclusiveMillis float64 `json:"exclusive_ms,omitempty"`
	Load            string  `json:"load"`
}

func runBenchCleanup(ctx context.Context, out io.Writer, f *benchCleanupFlags) error {
	var rounds []cleanupRound
	for r := range f.rounds {
		modes := []string{"delete", "partition"}
		if r%2 == 1 {
			modes = []string{"partition", "delete"}
		}
		for _, m := range modes {
			res, err := benchCleanupRound(ctx, f, m)
			if err != nil {
				return fmt.Errorf("bench cleanup (%s, round %d): %w", m, r+1, err)
			}
			rounds = append(rounds, res)
			if !f.asJSON {
				fmt.Fprintf(out, "round %d %s %-9s cleanup %6.2f s (exclusive lock %.1f ms), WAL %s, size %s -> %s, vacuum after %5.2f s / WAL %s, producer p50 %.1f p99 %.1f max %.1f ms (%d commits), load %s\n",
					r+1, f.table, m, res.CleanupSeconds, res.ExclusiveMillis, mib(res.CleanupWALBytes), mib(res.SizeBeforeBytes), mib(res.SizeAfterBytes),
					res.VacuumSeconds, mib(res.VacuumWALBytes), res.ProducerP50ms, res.ProducerP99ms, res.ProducerMaxms, res.ProducerCommits, res.Load)
			}
		}
	}
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rounds)
	}
	for _, m := range []string{"delete", "partition"} {
		var sec, p99, mx, vac []float64
		for _, r := range rounds {
			if r.Mode == m {
				sec, p99, mx, vac = append(sec, r.CleanupSeconds), append(p99, r.ProducerP99ms), append(mx, r.ProducerMaxms), append(vac, r.VacuumSeconds)
			}
		}
		fmt.Fprintf(out, "median %s %-9s cleanup %.2f s, vacuum after %.2f s, producer p99 %.1f ms, max %.1f ms\n", f.table, m, median(sec), median(vac), median(p99), median(mx))
	}
	return nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func benchCleanupRound(ctx context.Context, f *benchCleanupFlags, mode string) (cleanupRound, error) {
	res := cleanupRound{Table: f.table, Mode: mode, Rows: f.rows}
	inbox := f.table == "inbox"
	schema := "ferry_bench_" + benchRandHex()
	pool, drop, err := benchPGScratch(ctx, f.dbURL, schema, func(c *pgxpool.Config) { c.MaxConns = 8 })
	if err != nil {
		return res, err
	}
	defer drop()
	drv := pgxv5.New(pool)
	tables := ferry.Tables{}
	var mopts []migrate.Option
	table, part := "outbox", partition.Outbox
	switch {
	case inbox && mode == "partition":
		mopts = append(mopts, migrate.WithPartitionedInbox(24*time.Hour))
		table, part = "inbox", partition.Inbox
	case inbox:
		table = "inbox"
	case mode == "partition":
		mopts = append(mopts, migrate.WithPartitionedOutbox(24*time.Hour))
	}
	if _, err := migrate.Up(ctx, drv, tables, mopts...); err != nil {
		return res, err
	}
	// The rows are a day 8 days ago: created and published then. The
	// partitioned outbox gets that day's partition (migrate made today's
	// and the ones ahead, where the producer below writes).
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-8 * 24 * time.Hour)
	if mode == "partition" {
		if _, err := partition.Create(ctx, drv.Executor(), tables, part, day, 24*time.Hour); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	if inbox {
		// Claims of events with UUIDv7 ids of that day (a 48-bit
		// millisecond prefix, the version nibble, the rest unique), so
		// they land in the day's range.
		_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
SELECT 'c' || (g %% 5), 't', (lpad(to_hex((extract(epoch FROM $1::timestamptz) * 1000)::bigint + g %% 3600000), 12, '0') || '7' || substr(md5(g::text), 1, 19))::uuid,
    '\x00', 'order', 'o' || (g %% 1000), g, 'order.created', $1::timestamptz FROM generate_series(1, $2::int) g`, tables.Name("inbox")), day.Add(time.Hour), f.rows)
	} else {
		err = statebench.Prefill(ctx, pool, tables, statebench.Fill{Topic: "bench.order", Marked: f.rows, Aggregates: 1000,
			PayloadBytes: f.payload, MarkedStatus: true, At: day.Add(time.Hour)})
	}
	if err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+tables.Name(table)); err != nil {
		return res, err
	}
	res.PrefillSeconds = time.Since(t0).Seconds()
	size := func() (int64, error) {
		var n int64
		// pg_partition_tree lists a plain table as its only member too
		// (level 0); a partitioned one with every partition.
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree($1::regclass)`, tables.Name(table)).Scan(&n)
		if err == nil && n == 0 {
			err = pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, tables.Name(table)).Scan(&n)
		}
		return n, err
	}
	lsn := func() (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&n)
		return n, err
	}
	if res.SizeBeforeBytes, err = size(); err != nil {
		return res, err
	}
	o, err := ops.New(drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return res, err
	}
	w, err := outbox.New(drv, outbox.WithTopicTemplate("bench.order"))
	if err != nil {
		return res, err
	}

	// The producer (inbox: a consumer's claim of a new event): one per
	// commit, every 2 ms, during the cleanup.
	claimQ := fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('live', 't', $1, '\x00', 'order', $2, 1, 'order.created', now()) ON CONFLICT DO NOTHING`, tables.Name("inbox"))
	pctx, stopProducer := context.WithCancel(ctx)
	var mu sync.Mutex
	var lat []time.Duration
	var perr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
			s := time.Now()
			var err error
			if inbox {
				_, err = pool.Exec(pctx, claimQ, uuid.Must(uuid.NewV7()), fmt.Sprintf("p-%d", i))
			} else {
				_, err = w.Insert(pctx, ferry.Event{TenantID: "t", AggregateType: "order", AggregateID: fmt.Sprintf("p-%d", i%100),
					EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)})
			}
			if err != nil {
				if pctx.Err() == nil {
					mu.Lock()
					perr = err
					mu.Unlock()
				}
				return
			}
			mu.Lock()
			lat = append(lat, time.Since(s))
			mu.Unlock()
		}
	}()
	time.Sleep(100 * time.Millisecond) // the producer's pace before the cleanup starts
	l0, err := lsn()
	if err != nil {
		stopProducer()
		wg.Wait()
		return res, err
	}
	c0 := time.Now()
	cres, cerr := o.Cleanup(ctx, ops.CleanupOptions{Retention: 7 * 24 * time.Hour}, ops.Approval{Approve: true, Actor: "bench", Reason: "bench cleanup"})
	res.CleanupSeconds = time.Since(c0).Seconds()
	time.Sleep(100 * time.Millisecond)
	stopProducer()
	wg.Wait()
	if cerr != nil {
		return res, cerr
	}
	if perr != nil {
		return res, fmt.Errorf("producer: %w", perr)
	}
	l1, err := lsn()
	if err != nil {
		return res, err
	}
	res.CleanupWALBytes = l1 - l0
	res.Removed = cres.Outbox + cres.OutboxPartitionRows
	drops := cres.OutboxPartitions
	if inbox {
		res.Removed, drops = cres.Inbox+cres.InboxPartitionRows, cres.InboxPartitions
	}
	for _, p := range drops {
		res.ExclusiveMillis += p.ExclusiveMillis
	}
	if res.SizeAfterBytes, err = size(); err != nil {
		return res, err
	}
	var left int64
	leftQ := `SELECT count(*) FROM ` + tables.Name("outbox") + ` WHERE event_type <> 'order.created'`
	if inbox {
		leftQ = `SELECT count(*) FROM ` + tables.Name("inbox") + ` WHERE consumer <> 'live'`
	}
	if err := pool.QueryRow(ctx, leftQ).Scan(&left); err != nil {
		return res, err
	}
	if left != 0 {
		return res, fmt.Errorf("%d prefilled rows left after the cleanup: %+v", left, drops)
	}
	// What the cleanup leaves for later: the VACUUM that reclaims it.
	v0 := time.Now()
	if _, err := pool.Exec(ctx, `VACUUM `+tables.Name(table)); err != nil {
		return res, err
	}
	res.VacuumSeconds = time.Since(v0).Seconds()
	l2, err := lsn()
	if err != nil {
		return res, err
	}
	res.VacuumWALBytes = l2 - l1
	slices.Sort(lat)
	res.ProducerCommits = len(lat)
	res.ProducerP50ms, res.ProducerP99ms, res.ProducerMaxms = ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)), ms(quantile(lat, 1))
	res.Load = loadAvg()
	return res, nil
}
