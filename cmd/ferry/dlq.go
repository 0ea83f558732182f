package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newDLQCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Dead letters: outbox events the relay gave up on (list, show, retry, discard)",
		Long: `Dead letters are outbox rows with status dead: a permanent broker error or
too many attempts. Under the relay's hold policy their aggregate waits behind
them. retry puts them back to pending (attempts reset) for the relay that owns
the shard; discard keeps the row as evidence but takes it out of the DLQ.

Mutating commands preview by default and act only with --approve; every
action writes an audit row (--reason is required, --actor defaults to $USER).`,
	}
	cmd.AddCommand(newDLQListCmd(), newDLQShowCmd(), newDLQActionCmd("retry"), newDLQActionCmd("discard"))
	return cmd
}

func newDLQListCmd() *cobra.Command {
	var f opsFlags
	var ff outboxFilterFlags
	var discarded bool
	var after string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first, a page at a time (--limit, --after)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			filter.After = after
			p, err := o.ListDeadPage(cmd.Context(), filter, discarded)
			if err != nil {
				return err
			}
			return printPage(cmd.OutOrStdout(), f.json, p, "dead letter(s)", printOutboxRows)
		},
	}
	f.register(cmd)
	ff.register(cmd)
	addAfterFlag(cmd, &after)
	cmd.Flags().BoolVar(&discarded, "include-discarded", false, "also list discarded dead letters")
	return cmd
}

func newDLQShowCmd() *cobra.Command {
	var f opsFlags
	cmd := &cobra.Command{
		Use:   "show <event-id>",
		Short: "Show one outbox row (any status) with its relay state; the payload is never printed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			m, err := o.Message(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), m)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "event %s  (outbox id %d)\n", m.EventID, m.ID)
			fmt.Fprintf(w, "  tenant %s  aggregate %s/%s seq %d  type %s v%d  topic %s shard %d\n", m.TenantID, m.AggregateType, m.AggregateID, m.AggregateSeq, m.EventType, m.SchemaVersion, m.Topic, m.Shard)
			fmt.Fprintf(w, "  occurred %s  committed %s  payload %d bytes\n", ts(&m.OccurredAt), ts(&m.CreatedAt), m.PayloadBytes)
			fmt.Fprintf(w, "  principal %q action %q target %q correlation %q causation %q\n", m.Principal, m.Action, m.Target, m.CorrelationID, m.CausationID)
			fmt.Fprintf(w, "  status %s  attempts %d  next attempt %s  published %s  discarded %s\n", m.Status, m.Attempts, ts(&m.NextAttemptAt), ts(m.PublishedAt), ts(m.DiscardedAt))
			if m.LastError != "" {
				fmt.Fprintf(w, "  last error: %s\n", m.LastError)
			}
			if m.BrokerReceipt != "" {
				fmt.Fprintf(w, "  broker receipt: %s\n", m.BrokerReceipt)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newDLQActionCmd(action string) *cobra.Command {
	var f opsFlags
	var ff outboxFilterFlags
	var af approvalFlags
	short := "Put dead letters back to pending (attempts reset); the owning relay publishes them"
	if action == "discard" {
		short = "Mark dead letters discarded: kept as evidence, out of the DLQ and the dead-letter alert"
	}
	cmd := &cobra.Command{
		Use:   action,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			run := o.RetryDead
			if action == "discard" {
				run = o.DiscardDead
			}
			res, err := run(cmd.Context(), filter, af.approval())
			if err != nil {
				return err
			}
			return printResult(cmd.OutOrStdout(), f.json, res)
		},
	}
	f.register(cmd)
	ff.register(cmd)
	af.register(cmd)
	return cmd
}
