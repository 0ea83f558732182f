package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

// opsFlags are the flags of every operator command: the store plus the
// output format.
type opsFlags struct {
	store storeFlags
	json  bool
	mask  maskFlag
}

func (f *opsFlags) register(cmd *cobra.Command) {
	f.store.register(cmd)
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON instead of a table")
	f.mask.register(cmd)
}

// open connects and returns Ops; the caller closes the store.
func (f *opsFlags) open(cmd *cobra.Command, opts ...ops.Option) (*store, *ops.Ops, error) {
	s, err := f.store.open(cmd.Context(), cmd) // applies FERRY_* env to the flags
	if err != nil {
		return nil, nil, err
	}
	masks, err := f.mask.options()
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	opts = append(masks, opts...)
	// The command prints its own report; the logger only carries warnings.
	logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	o, err := ops.New(s, append([]ops.Option{ops.WithTables(f.store.tables()), ops.WithLogger(logger)}, opts...)...)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, o, nil
}

// approvalFlags are the flags of every mutating command: without
// --approve it is a dry run.
type approvalFlags struct {
	approve bool
	actor   string
	reason  string
}

func (f *approvalFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.approve, "approve", false, "act; without it the command only previews what would change (dry run)")
	cmd.Flags().StringVar(&f.actor, "actor", "", "who is acting, recorded in the audit table (default $USER)")
	cmd.Flags().StringVar(&f.reason, "reason", "", "why, recorded in the audit table (required)")
}

func (f *approvalFlags) approval() ops.Approval {
	actor := f.actor
	for _, env := range []string{"USER", "LOGNAME"} {
		if actor == "" {
			actor = os.Getenv(env)
		}
	}
	if actor == "" {
		if u, err := user.Current(); err == nil {
			actor = u.Username
		}
	}
	return ops.Approval{Approve: f.approve, Actor: actor, Reason: f.reason}
}

// outboxFilterFlags select outbox rows.
type outboxFilterFlags struct {
	ids                                  []string
	topic, tenant, aggType, aggID, evtyp string
	errContains                          string
	olderThan                            time.Duration
	since, until                         string
	all                                  bool
	limit                                int
}

func (f *outboxFilterFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringSliceVar(&f.ids, "id", nil, "event id (repeatable, or comma-separated)")
	fl.StringVar(&f.topic, "topic", "", "topic")
	fl.StringVar(&f.tenant, "tenant", "", "tenant id")
	fl.StringVar(&f.aggType, "aggregate-type", "", "aggregate type")
	fl.StringVar(&f.aggID, "aggregate", "", "aggregate id")
	fl.StringVar(&f.evtyp, "type", "", "event type")
	fl.StringVar(&f.errContains, "error-contains", "", "only rows whose last error contains this text (the failure reason)")
	fl.DurationVar(&f.olderThan, "older-than", 0, "only rows created at least this long ago")
	fl.StringVar(&f.since, "since", "", "only rows created at or after this time (RFC 3339)")
	fl.StringVar(&f.until, "until", "", "only rows created before this time (RFC 3339)")
	fl.BoolVar(&f.all, "all", false, "act on every row when no other filter is given")
	fl.IntVar(&f.limit, "limit", 0, fmt.Sprintf("rows per run (default %d, at most %d)", ops.DefaultActionLimit, ops.MaxActionLimit))
}

func (f *outboxFilterFlags) filter() (ops.Filter, error) {
	out := ops.Filter{EventIDs: f.ids, Topic: f.topic, TenantID: f.tenant, AggregateType: f.aggType, AggregateID: f.aggID,
		EventType: f.evtyp, ErrorContains: f.errContains, OlderThan: f.olderThan, All: f.all, Limit: f.limit}
	var err error
	if out.Since, err = parseTime("since", f.since); err != nil {
		return out, err
	}
	out.Until, err = parseTime("until", f.until)
	return out, err
}

func parseTime(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s: want RFC 3339 (2006-01-02T15:04:05Z): %w", flag, err)
	}
	return t, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return (time.Duration(seconds) * time.Second).String()
}

func ts(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// printResult prints an action's result: what would change (dry run) or
// what changed, with a sample of the rows.
func printResult(w io.Writer, asJSON bool, res ops.Result) error {
	return printAction(w, asJSON, res, "row(s) would change", "row(s) changed", printOutboxRows)
}

// printAction prints what an action would do (dry run) or did, and a
// sample of its rows; wouldDo and did finish "<n> …".
func printAction[T any](w io.Writer, asJSON bool, res ops.ActionResult[T], wouldDo, did string, printRows func(io.Writer, []T)) error {
	if asJSON {
		return printJSON(w, res)
	}
	if res.DryRun {
		fmt.Fprintf(w, "DRY RUN %s: %d %s. Re-run with --approve --reason \"…\" to act.\n", res.Action, res.Rows, wouldDo)
	} else {
		fmt.Fprintf(w, "%s: %d %s (audit #%d).\n", res.Action, res.Rows, did, res.AuditID)
	}
	if res.More {
		fmt.Fprintln(w, "More rows match than this run's --limit: run it again for the rest.")
	}
	if len(res.Sample) > 0 {
		printRows(w, res.Sample)
		if int64(len(res.Sample)) < res.Rows {
			fmt.Fprintf(w, "… and %d more\n", res.Rows-int64(len(res.Sample)))
		}
	}
	return nil
}

// printList prints rows of a list command: JSON (an empty array, never
// null) or a count line and a table.
func printList[T any](w io.Writer, asJSON bool, rows []T, noun string, printRows func(io.Writer, []T)) error {
	if asJSON {
		if rows == nil {
			rows = []T{}
		}
		return printJSON(w, rows)
	}
	fmt.Fprintf(w, "%d %s\n", len(rows), noun)
	if len(rows) > 0 {
		printRows(w, rows)
	}
	return nil
}

func printOutboxRows(w io.Writer, ms []ops.OutboxMessage) {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT ID\tTOPIC\tTENANT\tAGGREGATE\tSEQ\tTYPE\tSTATUS\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, m := range ms {
		status := m.Status
		if m.DiscardedAt != nil {
			status += " (discarded)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%d\t%s\t%s\t%d\t%s\t%s\n", m.EventID, m.Topic, m.TenantID, m.AggregateType, m.AggregateID,
			m.AggregateSeq, m.EventType, status, m.Attempts, ts(&m.CreatedAt), truncate(m.LastError, 60))
	}
	_ = tw.Flush()
}

func truncate(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func newStatusCmd() *cobra.Command {
	var f opsFlags
	var watch time.Duration
	var metricsAddr string
	var softCap, hardCap int64
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show outbox backlog per topic and shard, relays and leases, consumers, parked messages, effects and CDC slots",
		Long: `status reads Ferry's tables and prints what an operator watches: per topic and
shard the pending count, the oldest pending age, dead letters and the lease
holder; per relay instance its shards; per consumer the applied rate, parked
messages by reason and open gaps; effect intents by state; CDC slot lag.

It reads the database only, so it tells the truth when a relay or consumer is
down. --watch repeats it; --metrics-addr serves the same numbers as
Prometheus metrics (ferry_ops_*) for the alert rules in deploy/.

A missing or unreadable table never reads as zero. Each section (outbox,
relay, inbox, effects, ops, cdc) is read, "not installed" (none of its
tables exist and its migration is not recorded: fine), or FAILED: a table
that should exist is missing (the outbox always; any other once its
migration is recorded or some of its tables exist) or a query failed. A
failed section is printed with the reason, the rest is printed as usual,
and the command exits 1 (also with --json). The metrics export
ferry_ops_section_up{section} 0 and ferry_ops_up 0 for it, and none of
its own gauges.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			switch {
			case watch < 0:
				return fmt.Errorf("--watch must be >= 0 (0 prints once), got %s", watch)
			case softCap < 0:
				return fmt.Errorf("--soft-cap must be >= 0 (0: not exported), got %d", softCap)
			case hardCap < 0:
				return fmt.Errorf("--hard-cap must be >= 0 (0: not exported), got %d", hardCap)
			case softCap > 0 && hardCap > 0 && softCap > hardCap:
				return fmt.Errorf("--soft-cap %d is above --hard-cap %d", softCap, hardCap)
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			ctx := cmd.Context()
			if metricsAddr != "" {
				return serveMetrics(ctx, cmd.OutOrStdout(), o, metricsAddr, softCap, hardCap)
			}
			for {
				st, err := o.Status(ctx)
				// A failed section is printed (and marked) with the rest; the
				// command then exits non-zero. Any other error is fatal.
				if err != nil && !errors.Is(err, ops.ErrStatusIncomplete) {
					return err
				}
				incomplete := err
				if f.json {
					err = printJSON(cmd.OutOrStdout(), st)
				} else {
					if watch > 0 {
						fmt.Fprint(cmd.OutOrStdout(), "\033[H\033[2J")
					}
					printStatus(cmd.OutOrStdout(), st)
				}
				if err != nil {
					return err
				}
				if watch <= 0 {
					return incomplete
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(watch):
				}
			}
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh every interval (e.g. 5s) until interrupted")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve ferry_ops_* metrics on this address (e.g. :9188) at /metrics instead of printing")
	cmd.Flags().Int64Var(&softCap, "soft-cap", 0, "export this soft cap on pending outbox rows (ferry_ops_outbox_soft_cap) for the alert")
	cmd.Flags().Int64Var(&hardCap, "hard-cap", 0, "export this hard cap on pending outbox rows (ferry_ops_outbox_hard_cap)")
	return cmd
}

func serveMetrics(ctx context.Context, out io.Writer, o *ops.Ops, addr string, soft, hard int64) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(ops.NewCollector(o, ops.WithCaps(soft, hard))); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(out, "serving ferry_ops_* metrics on http://%s/metrics\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// sectionOf returns the status of section name ("ok" when Status did not
// report it, e.g. cdc on SQLite, which has no such section).
func sectionOf(st ops.Status, name string) ops.SectionStatus {
	for _, s := range st.Sections {
		if s.Name == name {
			return s
		}
	}
	return ops.SectionStatus{Name: name, State: ops.SectionNotInstalled}
}

func printStatus(w io.Writer, st ops.Status) {
	fmt.Fprintf(w, "Ferry status at %s\n\n", st.At.Format("2006-01-02 15:04:05Z"))
	var notInstalled []string
	for _, sec := range st.Sections {
		switch sec.State {
		case ops.SectionFailed:
			fmt.Fprintf(w, "FAILED  %s: %s; its numbers are unknown, not zero\n", sec.Name, sec.Error)
		case ops.SectionNotInstalled:
			notInstalled = append(notInstalled, fmt.Sprintf("%s (%s)", sec.Name, strings.Join(sec.Tables, ", ")))
		}
	}
	if len(st.Failed()) > 0 {
		fmt.Fprintln(w)
	}
	failed := func(name string) bool { return sectionOf(st, name).State == ops.SectionFailed }
	if failed(ops.SectionOutbox) {
		fmt.Fprintln(w, "OUTBOX  unknown (section failed)")
	} else {
		fmt.Fprintf(w, "OUTBOX  pending %d  oldest pending %s  dead %d  discarded %d\n", st.Outbox.Pending, age(st.Outbox.OldestPendingAge), st.Outbox.Dead, st.Outbox.Discarded)
	}
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	if len(st.Shards) > 0 {
		fmt.Fprintln(tw, "TOPIC\tSHARD\tPENDING\tOLDEST\tDEAD\tLEASE OWNER\tLEASE EXPIRES")
		for _, s := range st.Shards {
			owner := s.LeaseOwner
			switch {
			case failed(ops.SectionRelay):
				owner = "(unknown)"
			case owner == "" || !s.LeaseLive:
				owner = "(none)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%s\n", s.Topic, s.Shard, s.Pending, age(s.OldestPendingAge), s.Dead, owner, ts(s.LeaseExpiresAt))
		}
		_ = tw.Flush()
	}
	if st.UnownedShards > 0 {
		fmt.Fprintf(w, "WARNING: %d shard(s) have pending rows and no live relay lease\n", st.UnownedShards)
	}
	fmt.Fprintln(w)
	if failed(ops.SectionRelay) {
		fmt.Fprintln(w, "RELAYS  unknown (section failed)")
		fmt.Fprintln(w)
	}
	if len(st.Relays) > 0 {
		fmt.Fprintln(tw, "RELAY\tLIVE\tHEARTBEAT\tOWNED SHARDS\tBREAKER")
		for _, r := range st.Relays {
			fmt.Fprintf(tw, "%s\t%v\t%s\t%v\t%s\n", r.InstanceID, r.Live, ts(&r.HeartbeatAt), r.OwnedShards, r.Breaker)
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
	}
	if failed(ops.SectionInbox) {
		fmt.Fprintln(w, "CONSUMERS  unknown (section failed): parked messages and gaps are not known")
		fmt.Fprintln(w)
	}
	if len(st.Consumers) > 0 {
		fmt.Fprintln(tw, "CONSUMER\tAPPLIED/S (1m)\tLAST APPLIED\tPARKED (reason: count, oldest)\tOPEN GAPS\tOLDEST GAP")
		for _, c := range st.Consumers {
			var parked []string
			for _, p := range c.Parked {
				parked = append(parked, fmt.Sprintf("%s: %d, %s", p.Reason, p.Count, age(p.OldestAge)))
			}
			if len(parked) == 0 {
				parked = []string{"-"}
			}
			fmt.Fprintf(tw, "%s\t%.2f\t%s\t%s\t%d\t%s\n", c.Consumer, c.AppliedPerSecond, ts(c.LastAppliedAt), strings.Join(parked, "; "), c.OpenGaps, age(c.OldestGapAge))
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
	}
	if failed(ops.SectionEffects) {
		fmt.Fprintln(w, "OPEN EFFECTS  unknown (section failed)")
		fmt.Fprintln(w)
	}
	if len(st.Effects) > 0 {
		fmt.Fprintln(tw, "OPEN EFFECTS\tPENDING\tIN FLIGHT\tUNKNOWN\tOLDEST UNKNOWN")
		for _, e := range st.Effects {
			b := e.ByState
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", e.Consumer, b["pending"], b["in_flight"], b["unknown"], age(e.OldestUnknownAge))
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
	}
	if failed(ops.SectionCDC) {
		fmt.Fprintln(w, "CDC SLOTS  unknown (section failed)")
		fmt.Fprintln(w)
	}
	if len(st.CDC) > 0 {
		fmt.Fprintln(tw, "CDC SLOT\tEXISTS\tACTIVE\tLAG BYTES\tLOST\tLAST ERROR")
		for _, c := range st.CDC {
			fmt.Fprintf(tw, "%s\t%v\t%v\t%.0f\t%d\t%s\n", c.Slot, c.Exists, c.Active, c.LagBytes, c.LostCount, truncate(c.LastError, 60))
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
	}
	if failed(ops.SectionOps) {
		fmt.Fprintln(w, "replay window: unknown (section ops failed)")
	} else {
		fmt.Fprintf(w, "replay window: broker dedup %s, inbox replay horizon %s (cleanup refuses shorter retention)\n",
			st.Window.BrokerDedupWindow, st.Window.InboxReplayHorizon)
	}
	if len(notInstalled) > 0 {
		fmt.Fprintf(w, "not installed (not required: no migration recorded, none of their tables exist): %s\n", strings.Join(notInstalled, "; "))
	}
}
