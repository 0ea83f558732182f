package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/claimcheck"
	"github.com/ferryhq/ferry/ops"
)

func newClaimCheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "claimcheck",
		Short: "Manage the blobs of payloads sent by reference (see docs/CLAIMCHECK.md)",
	}
	cmd.AddCommand(newClaimCheckSweepCmd())
	return cmd
}

func newClaimCheckSweepCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var bucket string
	var opts claimcheck.SweepOptions
	cmd := &cobra.Command{
		Use:   "sweep --bucket URL --retention D",
		Short: "Delete claim-check blobs of writes that rolled back or crashed before their commit",
		Long: `sweep lists the claim-check blobs (claimcheck/<event id>) in --bucket and
deletes those that no outbox row references: older than --grace (longer
than any producer transaction, so a commit still in flight is never swept),
younger than --retention (set it to the outbox cleanup retention: an older
blob may belong to a row cleanup removed after it was sent) and with no
outbox row for their event id, looked up right before the delete. It never
deletes a blob a committed row references.

It previews by default (counts) and deletes only with --approve; the action
writes an audit row (--reason is required, --actor defaults to $USER).`,
		Example: `  ferry claimcheck sweep --bucket "file:///var/lib/ferry/blobs" --retention 192h
  ferry claimcheck sweep --bucket "file:///var/lib/ferry/blobs" --retention 192h --approve --reason "nightly"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			if bucket == "" {
				return fmt.Errorf("--bucket: required (the claim-check blob store's URL)")
			}
			if opts.Grace < time.Minute {
				return fmt.Errorf("--grace must be at least 1m (longer than any producer transaction), got %s", opts.Grace)
			}
			if opts.Retention <= opts.Grace {
				return fmt.Errorf("--retention must exceed --grace (%s), got %s", opts.Grace, opts.Retention)
			}
			st, err := claimcheck.Open(cmd.Context(), bucket, 1)
			if err != nil {
				return fmt.Errorf("--bucket: %w", err)
			}
			defer st.Close()
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			var counts claimcheck.SweepResult
			sweep := func(ctx context.Context, exists func(context.Context, string) (bool, error), dry bool) (int, int, error) {
				o := opts
				o.DryRun = dry
				r, err := st.Sweep(ctx, exists, o)
				counts = r
				return r.Orphans, r.Deleted, err
			}
			res, err := o.SweepClaimChecks(cmd.Context(), sweep, map[string]any{"grace": opts.Grace.String(), "retention": opts.Retention.String()}, af.approval())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), struct {
					ops.ClaimCheckSweep
					Blobs claimcheck.SweepResult `json:"blobs"`
				}{res, counts})
			}
			w := cmd.OutOrStdout()
			if res.DryRun {
				fmt.Fprintf(w, "DRY RUN %s: %d orphaned blob(s) would be deleted. Re-run with --approve --reason \"…\" to act.\n", res.Action, res.Orphans)
			} else {
				fmt.Fprintf(w, "%s: %d orphaned blob(s) deleted (audit #%d)\n", res.Action, res.Deleted, res.AuditID)
			}
			fmt.Fprintf(w, "  listed %d, referenced %d (kept), inside the grace period %d (kept), past the retention %d (kept)\n",
				counts.Listed, counts.Referenced, counts.Young, counts.Old)
			return nil
		},
	}
	f.register(cmd)
	af.register(cmd)
	cmd.Flags().StringVar(&bucket, "bucket", "", "claim-check blob store URL (file:///DIR built in; s3://, gs://, azblob:// need a build that links the driver) (required)")
	cmd.Flags().DurationVar(&opts.Grace, "grace", time.Hour, "never delete a blob younger than this (>= 1m; longer than any producer transaction)")
	cmd.Flags().DurationVar(&opts.Retention, "retention", 0, "never delete a blob older than this: the outbox cleanup retention (required, > --grace)")
	return cmd
}
