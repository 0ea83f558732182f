package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/archive"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/ops"
)

func newCleanupCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var opts ops.CleanupOptions
	var minWindow ops.Window
	var archiveURL string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete old sent outbox rows, inbox rows and finished effects in small batches, never inside the replay window",
		Long: `cleanup deletes, in batches of --batch-size rows chosen by primary key (each
batch its own short transaction; on Postgres SKIP LOCKED so it never waits
behind the relay):

  - sent outbox rows published more than --older-than ago;
  - discarded dead letters, only with --include-discarded (dead letters that
    were not discarded are never deleted);
  - inbox dedup rows applied more than --inbox-older-than ago (default: the
    outbox retention) and resolved parked messages; cursors are kept;
  - succeeded and failed effect-ledger rows (never pending, in-flight or
    unknown ones).

It REFUSES any retention shorter than the replay window — the broker's dedup
window and the inbox's replay horizon, stored in the ops_settings table (see
'ferry cleanup window') and raised, never lowered, by --min-broker-dedup-window
and --min-inbox-replay-horizon — because deleting a dedup row while its event
can still be redelivered or replayed applies that event twice. Inbox
retention must also be at least the outbox retention.

On Postgres, a partitioned outbox or inbox ('ferry migrate up
--partition-outbox / --partition-inbox') first has its partitions created
ahead, then each partition that ended before its retention detached and
dropped if its guard holds, checked with the partition locked: in the
outbox every row sent and published before the cutoff, in the inbox every
claim applied before it. A kept partition is printed with the reason; the
inbox's default partition is never dropped. The row-by-row deletes then run
for what remains (docs/PARTITIONING.md).

With --archive URL every batch is first written to that blob store (gzip
NDJSON plus a manifest with row count, id range and sha256; see
docs/ARCHIVE.md) and read back; a batch whose archive is not confirmed is
not deleted and the run stops with the error. file:///DIR?create_dir=1 is
built in; s3://, gs:// and azblob:// need a build that links the driver.
Read it back with 'ferry archive verify' and 'ferry archive restore'.

Previews (counts) by default; --approve deletes and writes an audit row.`,
		Example: `  ferry cleanup --older-than 192h
  ferry cleanup --older-than 192h --archive "file:///var/lib/ferry/archive?create_dir=1" --approve --reason "nightly"
  ferry cleanup --older-than 192h --batch-size 1000 --pause 50ms --approve --reason "nightly"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			switch {
			case opts.BatchSize < 1 || opts.BatchSize > ops.MaxCleanupBatch:
				return fmt.Errorf("--batch-size must be in 1..%d, got %d", ops.MaxCleanupBatch, opts.BatchSize)
			case opts.MaxBatches < 0:
				return fmt.Errorf("--max-batches must be >= 0 (0: until done), got %d", opts.MaxBatches)
			case opts.Pause < 0:
				return fmt.Errorf("--pause must be >= 0, got %s", opts.Pause)
			}
			s, o, err := f.open(cmd, ops.WithMinimumWindow(minWindow))
			if err != nil {
				return err
			}
			defer s.Close()
			if archiveURL != "" {
				st, err := openArchive(cmd.Context(), "--archive", archiveURL)
				if err != nil {
					return err
				}
				defer st.Close()
				opts.Archive = st
			}
			res, err := o.Cleanup(cmd.Context(), opts, af.approval())
			if err != nil {
				if n := res.Outbox + res.Discarded + res.Inbox + res.ResolvedParked + res.Effects; n > 0 && !res.DryRun {
					fmt.Fprintf(cmd.ErrOrStderr(), "cleanup stopped: %d rows were deleted before the error (outbox %d, discarded dead letters %d, inbox %d, resolved parked %d, effects %d; archived %d)\n",
						n, res.Outbox, res.Discarded, res.Inbox, res.ResolvedParked, res.Effects, res.Archived)
				}
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			verb := "deleted"
			if res.DryRun {
				verb = "would delete (DRY RUN; re-run with --approve --reason \"…\")"
			}
			fmt.Fprintf(w, "cleanup %s: outbox %d, discarded dead letters %d, inbox %d, resolved parked %d, effects %d",
				verb, res.Outbox, res.Discarded, res.Inbox, res.ResolvedParked, res.Effects)
			if !res.DryRun {
				fmt.Fprintf(w, " in %d batches (audit #%d)", res.Batches, res.AuditID)
			}
			fmt.Fprintln(w)
			if res.ArchiveLocation != "" && !res.DryRun {
				fmt.Fprintf(w, "archived %d rows to %s before deleting them\n", res.Archived, res.ArchiveLocation)
			}
			fmt.Fprintf(w, "replay window: broker dedup %s, inbox replay horizon %s\n", res.Window.BrokerDedupWindow, res.Window.InboxReplayHorizon)
			if len(res.Skipped) > 0 {
				fmt.Fprintf(w, "not installed, skipped: %s\n", strings.Join(res.Skipped, ", "))
			}
			for _, pv := range []struct {
				table string
				parts []ops.PartitionDrop
			}{{"outbox", res.OutboxPartitions}, {"inbox", res.InboxPartitions}} {
				for _, p := range pv.parts {
					what := fmt.Sprintf("dropped (%s locked exclusively %.1f ms)", pv.table, p.ExclusiveMillis)
					switch {
					case p.Dropped && res.DryRun:
						what = "would drop"
					case !p.Dropped:
						what = "kept: " + p.Kept
					}
					fmt.Fprintf(w, "%s partition %s [%s, %s) ~%d rows: %s\n", pv.table, p.Name, p.From.Format(time.RFC3339), p.To.Format(time.RFC3339), p.RowsEstimate, what)
				}
			}
			if len(res.PartitionsCreated) > 0 {
				fmt.Fprintf(w, "partitions created ahead: %s\n", strings.Join(res.PartitionsCreated, ", "))
			}
			if res.PartitionsNotCreated != "" {
				fmt.Fprintf(w, "warning: %s\n", res.PartitionsNotCreated)
			}
			return nil
		},
	}
	f.register(cmd)
	af.register(cmd)
	fl := cmd.Flags()
	fl.DurationVar(&opts.Retention, "older-than", 0, "outbox retention: delete sent rows published longer ago than this (required)")
	fl.DurationVar(&opts.InboxRetention, "inbox-older-than", 0, "inbox retention (default: --older-than; never shorter)")
	fl.DurationVar(&opts.EffectRetention, "effects-older-than", 0, "finished effect retention (default: the inbox retention)")
	fl.BoolVar(&opts.IncludeDiscarded, "include-discarded", false, "also delete discarded dead letters older than --older-than")
	fl.IntVar(&opts.BatchSize, "batch-size", ops.DefaultCleanupBatch, fmt.Sprintf("rows per DELETE (at most %d)", ops.MaxCleanupBatch))
	fl.IntVar(&opts.MaxBatches, "max-batches", 0, "stop after this many batches per table (0: until done)")
	fl.DurationVar(&opts.Pause, "pause", 0, "sleep between batches")
	fl.StringVar(&archiveURL, "archive", "", "write each batch to this blob store (file:///DIR?create_dir=1, s3://…) and delete only what it confirmed")
	fl.DurationVar(&minWindow.BrokerDedupWindow, "min-broker-dedup-window", 0, "raise the broker dedup window the guard uses (never lowers the stored setting)")
	fl.DurationVar(&minWindow.InboxReplayHorizon, "min-inbox-replay-horizon", 0, "raise the inbox replay horizon the guard uses")
	cmd.AddCommand(newCleanupWindowCmd())
	return cmd
}

// openArchive opens the blob store cleanup archives into (ferry cleanup
// --archive, ferry relay --cleanup-archive); errors name flag.
func openArchive(ctx context.Context, flag, rawURL string) (*archive.Store, error) {
	st, err := archive.Open(ctx, rawURL, archive.WithFerryVersion(version(debug.ReadBuildInfo())))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return st, nil
}

func newCleanupWindowCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var w ops.Window
	var set, allowBelow bool
	var brokerURL, stream string
	cmd := &cobra.Command{
		Use:   "window",
		Short: "Show the replay window cleanup enforces, or store a new one (--set, audited)",
		Long: `window shows the replay window cleanup enforces, or stores a new one with
--set (a dry run without --approve; audited).

The broker dedup window stands for the broker's own setting, so --set
compares it with the broker where the broker has one: with --broker-url
nats://… (or FERRY_BROKER_URL) it reads the JetStream stream --stream's
duplicate window and refuses a shorter --broker-dedup-window, naming both
(--allow-below-broker stores it anyway, with a warning). Kafka and RabbitMQ
have no broker-side dedup window: nothing to compare, and it says so.
Without --broker-url nothing is compared, and it says so too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			out := cmd.OutOrStdout()
			if !set {
				cur, err := o.ReplayWindow(cmd.Context())
				if err != nil {
					return err
				}
				if f.json {
					return printJSON(out, cur)
				}
				fmt.Fprintf(out, "broker dedup window %s, inbox replay horizon %s: cleanup refuses retention below %s\n", cur.BrokerDedupWindow, cur.InboxReplayHorizon, cur.Min())
				return nil
			}
			if err := checkBrokerWindow(cmd, w, brokerURL, stream, allowBelow); err != nil {
				return err
			}
			res, err := o.SetReplayWindow(cmd.Context(), w, af.approval())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, res)
			}
			if res.DryRun {
				fmt.Fprintf(out, "DRY RUN: would set broker dedup window %s, inbox replay horizon %s. Re-run with --approve --reason \"…\".\n", w.BrokerDedupWindow, w.InboxReplayHorizon)
			} else {
				fmt.Fprintf(out, "stored broker dedup window %s, inbox replay horizon %s (audit #%d)\n", w.BrokerDedupWindow, w.InboxReplayHorizon, res.AuditID)
			}
			return nil
		},
	}
	f.register(cmd)
	af.register(cmd)
	cmd.Flags().BoolVar(&set, "set", false, "store the window given by --broker-dedup-window and --inbox-replay-horizon")
	cmd.Flags().DurationVar(&w.BrokerDedupWindow, "broker-dedup-window", 2*time.Minute, "the broker's dedup/redelivery window")
	cmd.Flags().DurationVar(&w.InboxReplayHorizon, "inbox-replay-horizon", 7*24*time.Hour, "how far back events may be redelivered or replayed to consumers")
	cmd.Flags().StringVar(&brokerURL, "broker-url", "", "--set: compare with this broker's dedup window (nats://…, embedded; kafka:// and amqp:// have none)")
	cmd.Flags().StringVar(&stream, "stream", "FERRY", "--set with NATS: the JetStream stream whose duplicate window is compared")
	cmd.Flags().BoolVar(&allowBelow, "allow-below-broker", false, "--set: store a broker dedup window shorter than the broker's anyway (warns)")
	return cmd
}

// checkBrokerWindow compares --broker-dedup-window with the broker's own
// dedup window where the broker has one, and refuses a shorter one unless
// allowBelow (then it warns). It says on stderr when nothing was compared.
func checkBrokerWindow(cmd *cobra.Command, w ops.Window, url, stream string, allowBelow bool) error {
	stderr := cmd.ErrOrStderr()
	var broker time.Duration
	var source string
	switch {
	case url == "":
		fmt.Fprintln(stderr, "note: --broker-dedup-window not compared with the broker: give --broker-url (nats://… and --stream) to check it against the stream's duplicate window")
		return nil
	case url == "embedded":
		// `ferry relay --broker-url embedded` creates its stream in-process
		// with JetStream's default; this process cannot reach that server.
		broker = natsjs.DefaultDuplicateWindow
		source = fmt.Sprintf("the duplicate window of stream %q on the embedded broker (`ferry relay --broker-url embedded` creates it with JetStream's default)", stream)
	case strings.HasPrefix(url, "nats://"), strings.HasPrefix(url, "tls://"):
		d, err := streamDuplicateWindow(cmd.Context(), url, stream)
		if err != nil {
			return fmt.Errorf("--broker-url %s --stream %s: read the duplicate window to compare --broker-dedup-window with: %w (omit --broker-url to skip the comparison)", url, stream, err)
		}
		broker = d
		source = fmt.Sprintf("the duplicate window of JetStream stream %q (Duplicates)", stream)
	case strings.HasPrefix(url, "kafka://"):
		fmt.Fprintln(stderr, "note: Kafka has no broker-side dedup window (the idempotent producer deduplicates only within one producer session): nothing to compare --broker-dedup-window with")
		return nil
	case strings.HasPrefix(url, "amqp://"), strings.HasPrefix(url, "amqps://"):
		fmt.Fprintln(stderr, "note: RabbitMQ has no dedup window: nothing to compare --broker-dedup-window with")
		return nil
	default:
		return fmt.Errorf("--broker-url %q: want nats://…, tls://…, embedded, kafka://… or amqp://…", url)
	}
	err := ops.CheckBrokerWindow(w, broker, source)
	switch {
	case err == nil:
		fmt.Fprintf(cmd.OutOrStdout(), "%s is %s: --broker-dedup-window %s covers it\n", source, broker, w.BrokerDedupWindow)
		return nil
	case allowBelow:
		fmt.Fprintf(stderr, "WARNING: %v; storing it anyway (--allow-below-broker)\n", err)
		return nil
	default:
		return fmt.Errorf("%w; pass --allow-below-broker to store it anyway", err)
	}
}

// streamDuplicateWindow reads a JetStream stream's duplicate window.
func streamDuplicateWindow(ctx context.Context, url, stream string) (time.Duration, error) {
	nc, err := natsjs.Connect(url)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s, err := js.Stream(cctx, stream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().Config.Duplicates, nil
}
