package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

func newEvidenceCmd() *cobra.Command {
	var f opsFlags
	var kind string
	cmd := &cobra.Command{
		Use:   "evidence <event-id | correlation-id | command-key>",
		Short: "Did it really happen? The story of an event from the tables alone: committed, published, applied, effects",
		Long: `evidence reads the outbox, the audit table, the inbox, parked messages, the
effect ledger and the command keys, and prints what they say about one event
(or every event of a correlation id or command key): committed (outbox row,
time, tenant, principal), published (status, receipt, attempts, replays),
applied by which consumers (inbox rows) or parked (reason), and external
effects (ledger state, provider operation id, reconciliations).

Only rows count as evidence. A missing table is reported as "not installed",
never as "did not happen". --json prints the same structure ops.Evidence
returns.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k := ops.EvidenceKind(kind)
			if kind == "auto" {
				k = ops.KindAuto
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			ev, err := o.Evidence(cmd.Context(), args[0], k)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), ev)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "evidence for %s %q: %d event(s)\n", ev.Kind, ev.Query, len(ev.Events))
			if c := ev.Command; c != nil {
				fmt.Fprintf(w, "command key %s (tenant %s) stored %s, expires %s\n", c.Key, c.TenantID, ts(&c.CreatedAt), ts(&c.ExpiresAt))
			}
			for _, e := range ev.Events {
				fmt.Fprintf(w, "\nevent %s: %s\n", e.EventID, e.Summary)
				if c := e.Committed; c != nil {
					fmt.Fprintf(w, "  committed  %s  tenant %s  principal %q action %q target %q\n", ts(&c.At), c.TenantID, c.Principal, c.Action, c.Target)
					fmt.Fprintf(w, "             %s/%s seq %d  %s v%d  topic %s  correlation %q\n", c.AggregateType, c.AggregateID, c.AggregateSeq, c.EventType, c.SchemaVersion, c.Topic, c.CorrelationID)
				}
				if p := e.Published; p != nil {
					fmt.Fprintf(w, "  published  status %s  at %s  publications %d  attempts %d  receipt %s\n", p.Status, ts(p.PublishedAt), p.Publications, p.Attempts, p.Receipt)
					if p.LastError != "" {
						fmt.Fprintf(w, "             last error: %s\n", p.LastError)
					}
					if p.Broker == ops.BrokerUnknown {
						fmt.Fprintf(w, "             broker: UNKNOWN — %s\n", p.UnknownReason)
					}
				}
				for _, a := range e.Applied {
					fmt.Fprintf(w, "  applied    by %s at %s\n", a.Consumer, ts(&a.AppliedAt))
				}
				for _, p := range e.Parked {
					state := "OPEN"
					if p.ResolvedAt != nil {
						state = "resolved " + p.Resolution + " at " + ts(p.ResolvedAt)
					}
					fmt.Fprintf(w, "  parked     by %s as %s (%d attempts, first %s) %s %s\n", p.Consumer, p.Reason, p.Attempts, ts(&p.FirstSeen), state, truncate(p.LastError, 60))
				}
				for _, x := range e.Effects {
					fmt.Fprintf(w, "  effect     %s/%s %s→%s: %s  operation id %q  attempts %d  reconciliations %d\n",
						x.Consumer, x.Step, x.Target, x.Operation, strings.ToUpper(x.State), x.OperationID, x.Attempts, x.Reconciliations)
				}
				for _, a := range e.Audit {
					fmt.Fprintf(w, "  audit      #%d %s by %s at %s: %s\n", a.ID, a.Action, a.Actor, ts(&a.At), a.Reason)
				}
			}
			if len(ev.Missing) > 0 {
				fmt.Fprintf(w, "\nnot installed (their part of the story is unknown, not negative): %s\n", strings.Join(ev.Missing, ", "))
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&kind, "kind", "auto", "how to read the argument: auto, event_id, correlation_id, command_key")
	return cmd
}
