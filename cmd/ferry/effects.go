package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

func newEffectsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "effects",
		Short: "Failed effect intents: calls to outside systems that were not applied (list, requeue)",
		Long: `An effect intent fails when the outside system rejected the call, or was never
reached (or a status query found nothing) until the worker's attempts ran out:
in both cases nothing was applied. Unknown outcomes never fail; they stay open
until reconciled (see ferry status).

requeue puts failed intents back to pending for the effect worker, which runs
them again with the same idempotency key. It previews by default and acts only
with --approve; every action writes an audit row (--reason is required,
--actor defaults to $USER).`,
	}
	cmd.AddCommand(newEffectsFailedCmd(), newEffectsRequeueCmd())
	return cmd
}

type effectFilterFlags struct {
	keys                                   []string
	consumer, target, tenant, errorContain string
	all                                    bool
	limit                                  int
}

func (f *effectFilterFlags) register(cmd *cobra.Command, action bool) {
	fl := cmd.Flags()
	fl.StringSliceVar(&f.keys, "key", nil, "idempotency key (repeatable or comma-separated)")
	fl.StringVar(&f.consumer, "consumer", "", "consumer that recorded the intent")
	fl.StringVar(&f.target, "target", "", "outside system (the intent's target)")
	fl.StringVar(&f.tenant, "tenant", "", "tenant id")
	fl.StringVar(&f.errorContain, "error-contains", "", "keep intents whose last error contains this text")
	fl.IntVar(&f.limit, "limit", 0, fmt.Sprintf("rows to list or change (default %d, at most %d)", ops.DefaultActionLimit, ops.MaxActionLimit))
	if action {
		fl.BoolVar(&f.all, "all", false, "act on every failed intent (required when no other filter is given)")
	}
}

func (f *effectFilterFlags) filter() ops.EffectFilter {
	return ops.EffectFilter{Keys: f.keys, Consumer: f.consumer, Target: f.target, TenantID: f.tenant,
		ErrorContains: f.errorContain, All: f.all, Limit: f.limit}
}

func newEffectsFailedCmd() *cobra.Command {
	var f opsFlags
	var ff effectFilterFlags
	var after string
	cmd := &cobra.Command{
		Use:   "failed",
		Short: "List failed effect intents, oldest first, a page at a time (--limit, --after; requests are never printed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			filter := ff.filter()
			filter.After = after
			p, err := o.ListFailedEffectsPage(cmd.Context(), filter)
			if err != nil {
				return err
			}
			return printPage(cmd.OutOrStdout(), f.json, p, "failed effect(s)", printEffectRows)
		},
	}
	f.register(cmd)
	ff.register(cmd, false)
	addAfterFlag(cmd, &after)
	return cmd
}

func newEffectsRequeueCmd() *cobra.Command {
	var f opsFlags
	var ff effectFilterFlags
	var af approvalFlags
	cmd := &cobra.Command{
		Use:   "requeue",
		Short: "Put failed effect intents back to pending; the worker runs them again with the same key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			res, err := o.RequeueFailedEffects(cmd.Context(), ff.filter(), af.approval())
			if err != nil {
				return err
			}
			return printAction(cmd.OutOrStdout(), f.json, res, "intent(s) would be requeued", "intent(s) requeued", printEffectRows)
		},
	}
	f.register(cmd)
	ff.register(cmd, true)
	af.register(cmd)
	return cmd
}

func printEffectRows(w io.Writer, es []ops.FailedEffect) {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tCONSUMER\tTARGET\tOPERATION\tTENANT\tEVENT ID\tSTEP\tATTEMPTS\tCOMPLETED\tLAST ERROR")
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Key, e.Consumer, e.Target, e.Operation, e.TenantID, e.EventID,
			e.Step, e.Attempts, ts(e.CompletedAt), truncate(e.LastError, 60))
	}
	_ = tw.Flush()
}
