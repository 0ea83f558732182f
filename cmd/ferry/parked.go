package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

type parkedFilterFlags struct {
	consumer, reason, tenant, aggType, aggID, evtyp string
	ids                                             []int64
	eventIDs                                        []string
	olderThan                                       time.Duration
	resolved, all                                   bool
	limit                                           int
	after                                           string
}

func (f *parkedFilterFlags) register(cmd *cobra.Command, listing bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.consumer, "consumer", "", "consumer name")
	fl.StringVar(&f.reason, "reason-code", "", "park reason: gap, schema, unauthorized, poison, collision, undecodable")
	fl.Int64SliceVar(&f.ids, "id", nil, "parked message id (repeatable)")
	fl.StringSliceVar(&f.eventIDs, "event-id", nil, "event id (repeatable)")
	fl.StringVar(&f.tenant, "tenant", "", "tenant id")
	fl.StringVar(&f.aggType, "aggregate-type", "", "aggregate type")
	fl.StringVar(&f.aggID, "aggregate", "", "aggregate id")
	fl.StringVar(&f.evtyp, "type", "", "event type")
	fl.DurationVar(&f.olderThan, "older-than", 0, "only messages first seen at least this long ago")
	fl.IntVar(&f.limit, "limit", 0, fmt.Sprintf("rows per run (default %d)", ops.DefaultActionLimit))
	if listing {
		fl.BoolVar(&f.resolved, "include-resolved", false, "also list resolved messages")
		addAfterFlag(cmd, &f.after)
	} else {
		fl.BoolVar(&f.all, "all", false, "act on every open parked message when no other filter is given")
	}
}

func (f *parkedFilterFlags) filter() ops.ParkedFilter {
	return ops.ParkedFilter{Consumer: f.consumer, Reason: f.reason, IDs: f.ids, EventIDs: f.eventIDs, TenantID: f.tenant,
		AggregateType: f.aggType, AggregateID: f.aggID, EventType: f.evtyp, OlderThan: f.olderThan,
		IncludeResolved: f.resolved, All: f.all, Limit: f.limit, After: f.after}
}

func newParkedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "Parked inbox messages: list, show, replay, release-gap",
		Long: `A consumer's inbox parks what it must not apply yet or ever: a gap (an earlier
event of the aggregate is missing), an unsupported schema, a denied
authorization, a poison message, a collision (same id, other content), or an
undecodable message. Nothing is dropped.

replay and release-gap do not run the consumer's code here — this process has
neither its handler nor its authorization. They mark the rows; the consumer
process (which runs ops.ServeReplayRequests next to its inbox) replays them
through the inbox's live path within its polling interval, re-running the
current schema, authorization, dedup and cursor checks. A message whose
authorization is still denied stays parked. Outcomes are written to the audit
table (actor consumer/<name>); follow them with 'ferry parked show <id>'.

Mutating commands preview by default and act only with --approve; --reason is
required (the park reason filter is --reason-code).`,
	}
	cmd.AddCommand(newParkedListCmd(), newParkedShowCmd(), newParkedRequestCmd("replay"), newParkedRequestCmd("release-gap"))
	return cmd
}

func printParked(w io.Writer, ps []ops.ParkedMessage) {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tREASON\tEVENT ID\tAGGREGATE\tSEQ\tTYPE\tATTEMPTS\tFIRST SEEN\tSTATE\tLAST ERROR")
	for _, p := range ps {
		state := "open"
		switch {
		case p.ResolvedAt != nil:
			state = "resolved: " + p.Resolution
		case p.ReplayRequestedAt != nil:
			state = "requested: " + p.ReplayRequest
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s/%s\t%d\t%s\t%d\t%s\t%s\t%s\n", p.ID, p.Consumer, p.Reason, p.EventID, p.AggregateType, p.AggregateID,
			p.AggregateSeq, p.EventType, p.Attempts, ts(&p.FirstSeen), state, truncate(p.LastError, 50))
	}
	_ = tw.Flush()
}

func newParkedListCmd() *cobra.Command {
	var f opsFlags
	var pf parkedFilterFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List parked messages (open ones unless --include-resolved), a page at a time (--limit, --after)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			p, err := o.ListParkedPage(cmd.Context(), pf.filter())
			if err != nil {
				return err
			}
			return printPage(cmd.OutOrStdout(), f.json, p, "parked message(s)", printParked)
		},
	}
	f.register(cmd)
	pf.register(cmd, true)
	return cmd
}

func newParkedShowCmd() *cobra.Command {
	var f opsFlags
	cmd := &cobra.Command{
		Use:   "show <id>",
		Short: "Show one parked message (payload size only)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var id int64
			if _, err := fmt.Sscan(args[0], &id); err != nil || id <= 0 {
				return fmt.Errorf("parked message id must be a positive integer, got %q", args[0])
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			p, err := o.Parked(cmd.Context(), id)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			printParked(cmd.OutOrStdout(), []ops.ParkedMessage{p})
			fmt.Fprintf(cmd.OutOrStdout(), "principal %q action %q target %q correlation %q tenant %q payload %d bytes\n",
				p.Principal, p.Action, p.Target, p.CorrelationID, p.TenantID, p.PayloadBytes)
			if p.LastError != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "last error: %s\n", p.LastError)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newParkedRequestCmd(kind string) *cobra.Command {
	var f opsFlags
	var pf parkedFilterFlags
	var af approvalFlags
	short := "Ask the consumer to replay parked messages through its current checks"
	if kind == "release-gap" {
		short = "Ask the consumer to stop waiting for missing events before parked gap messages, then replay them"
	}
	cmd := &cobra.Command{
		Use:   kind,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			run := o.RequestReplay
			if kind == "release-gap" {
				run = o.RequestReleaseGap
			}
			res, err := run(cmd.Context(), pf.filter(), af.approval())
			if err != nil {
				return err
			}
			return printAction(cmd.OutOrStdout(), f.json, res, "parked message(s) would be handed to their consumer",
				"parked message(s) marked; the consumer replays them through its checks on its next pass", printParked)
		},
	}
	f.register(cmd)
	pf.register(cmd, false)
	af.register(cmd)
	return cmd
}
