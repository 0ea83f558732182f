package main

import (
	"github.com/spf13/cobra"
)

func newReplayCmd() *cobra.Command {
	var f opsFlags
	var ff outboxFilterFlags
	var af approvalFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Re-publish sent outbox events (same event ids) by id, aggregate, type, topic or time range",
		Long: `replay sets matching sent outbox rows back to pending (attempts 0, due now), so
the relay that owns each shard publishes them again with their original event
ids. Nothing is published by this command itself.

Consumers receive the events again. A consumer with a Ferry inbox absorbs
them as duplicates (same event id) as long as its inbox rows were not cleaned
up; a consumer without one repeats its effect. The broker may also drop the
re-publish as a duplicate if it falls inside its dedup window.

Previews by default; --approve acts and writes an audit row (--reason required).`,
		Example: `  ferry replay --aggregate-type order --aggregate 42
  ferry replay --type order.paid --since 2026-11-30T10:00:00Z --until 2026-11-30T11:00:00Z --approve --reason "INC-7: consumer lost a day"`,
		Args: cobra.NoArgs,
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
			res, err := o.Replay(cmd.Context(), filter, af.approval())
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
