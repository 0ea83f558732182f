package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

func newApprovalsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "Approve or reject the actions agents proposed (ferry mcp request_action)",
		Long: `An agent (ferry mcp) can preview an operator action and request it; it can
never approve it. A human does, here: approve executes exactly the plan the
agent previewed — the same rows, only if they are still in the previewed
state; otherwise it refuses and prints what changed. Every step is an audit
row. The approver is --actor or $USER, recorded as a human operator: whoever
runs this command holds the database credentials, so keep them from agents.`,
	}
	cmd.AddCommand(newApprovalsListCmd(), newApprovalsDecideCmd(true), newApprovalsDecideCmd(false))
	return cmd
}

func newApprovalsListCmd() *cobra.Command {
	var f opsFlags
	var status string
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List approval requests, newest first (--status pending|approved|executed|rejected|refused)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			rs, err := o.ListApprovals(cmd.Context(), status, limit)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), rs)
			}
			w := cmd.OutOrStdout()
			if len(rs) == 0 {
				fmt.Fprintln(w, "no approval requests")
				return nil
			}
			for _, r := range rs {
				printApproval(w, r)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only requests in this status")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many (1..10000)")
	return cmd
}

func printApproval(w io.Writer, r ops.ApprovalRequest) {
	who := r.RequestedBy
	if r.RequestedAgent {
		who += " (agent)"
	}
	fmt.Fprintf(w, "#%d  %s  %s  %d row(s)  requested by %s at %s\n", r.ID, r.Status, r.Action, r.Rows, who, ts(&r.CreatedAt))
	fmt.Fprintf(w, "     reason: %s\n     plan %s\n", r.Reason, r.PlanHash)
	for i, p := range r.Plan {
		if i == 10 {
			fmt.Fprintf(w, "     … %d more\n", len(r.Plan)-10)
			break
		}
		fmt.Fprintf(w, "     - %s %d %s [%s]\n", p.Table, p.ID, p.Key, p.State)
	}
	if r.DecidedBy != "" {
		fmt.Fprintf(w, "     decided by %s at %s: %s\n", r.DecidedBy, ts(r.DecidedAt), r.DecisionReason)
	}
	if r.Result != "" {
		fmt.Fprintf(w, "     result: %s\n", r.Result)
	}
}

func newApprovalsDecideCmd(approve bool) *cobra.Command {
	var f opsFlags
	var a approvalFlags
	use, short := "reject <id>", "Reject a pending request: nothing runs"
	if approve {
		use, short = "approve <id>", "Approve a pending request: execute exactly its previewed plan, if the rows are unchanged"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return fmt.Errorf("approval id: a positive number from ferry approvals list, got %q", args[0])
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			appr := a.approval()
			me := opsauth.Identity{Name: appr.Actor, Role: opsauth.RoleOperator, Source: "local"}
			var r ops.ApprovalRequest
			if approve {
				r, err = o.ApproveRequest(cmd.Context(), id, me, a.reason)
			} else {
				r, err = o.RejectRequest(cmd.Context(), id, me, a.reason)
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printApproval(cmd.OutOrStdout(), r)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&a.actor, "actor", "", "who decides, recorded in the audit table (default $USER)")
	cmd.Flags().StringVar(&a.reason, "reason", "", "why, recorded in the audit table (required)")
	return cmd
}
