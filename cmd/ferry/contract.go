package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/contract"
)

func newContractCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "contract",
		Short: "Check event contracts (JSON Schema per event type and version) for breaking changes and against golden samples",
		Long: `Event contracts live in the service's repository as
contracts/<event_type>/v<N>.json (JSON Schema), with golden payloads in
contracts/<event_type>/v<N>.samples/*.json (must validate) and
*.invalid.json (must not). outbox.WithContracts refuses a payload that breaks
its contract; inbox.WithContracts parks one (reason schema).`,
	}
	cmd.AddCommand(newContractCheckCmd(), newContractTestCmd())
	return cmd
}

func newContractCheckCmd() *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "check OLD_DIR NEW_DIR",
		Short: "Report breaking changes between two contract sets (exit 1 if any)",
		Long: `check compares the contract set in OLD_DIR (e.g. the main branch's) with
NEW_DIR (the change under review). Breaking in every mode: an existing
version whose schema changed (version-reused; publish a new version instead)
and a deleted version (version-removed). A new version is compared with the
highest lower version of its event type:

  backward (consumers upgrade first): narrowed-type, new-required (without
           a default), enum-removed
  forward  (producers upgrade first): removed-required, widened-type,
           enum-added
  full     (default): both

Each finding names the contract, the version compared against, the schema
location and the rule. Exit status 1 when anything breaks.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := contract.ParseMode(mode)
			if err != nil {
				return err
			}
			old, err := contract.Load(args[0])
			if err != nil {
				return err
			}
			nw, err := contract.Load(args[1])
			if err != nil {
				return err
			}
			changes := contract.Check(old, nw, m)
			for _, c := range changes {
				fmt.Fprintln(cmd.OutOrStdout(), "BREAKING", c)
			}
			if len(changes) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferry contract check: %d breaking change(s) (mode %s)\n", len(changes), m)
				return exitCodeError{code: 1}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "no breaking changes (mode %s, %d contracts)\n", m, len(nw.Keys()))
			return nil
		},
	}
	cmd.Flags().StringVar(&mode, "mode", string(contract.Full), "compatibility mode: backward, forward or full")
	return cmd
}

func newContractTestCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "test [DIR]",
		Short: "Validate the golden samples (v<N>.samples/*.json) against their contracts (default DIR: contracts)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "contracts"
			if len(args) == 1 {
				dir = args[0]
			}
			set, err := contract.Load(dir)
			if err != nil {
				return err
			}
			res, err := contract.RunSamples(dir, set)
			if err != nil {
				return err
			}
			failed := 0
			for _, r := range res {
				switch {
				case r.OK() && r.WantInvalid:
					fmt.Fprintf(cmd.OutOrStdout(), "ok   %s (rejected: %v)\n", r.File, r.Err)
				case r.OK():
					fmt.Fprintf(cmd.OutOrStdout(), "ok   %s\n", r.File)
				case r.WantInvalid:
					failed++
					fmt.Fprintf(cmd.OutOrStdout(), "FAIL %s: named .invalid.json but validates against %s\n", r.File, r.Key)
				default:
					failed++
					var v *contract.Violation
					if errors.As(r.Err, &v) {
						fmt.Fprintf(cmd.OutOrStdout(), "FAIL %s: %v\n", r.File, v)
					} else {
						fmt.Fprintf(cmd.OutOrStdout(), "FAIL %s: %v\n", r.File, r.Err)
					}
				}
			}
			if len(res) == 0 {
				return fmt.Errorf("ferry contract test: no samples under %s/<event_type>/v<N>.samples/", dir)
			}
			if failed > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferry contract test: %d of %d samples failed\n", failed, len(res))
				return exitCodeError{code: 1}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d samples ok\n", len(res))
			return nil
		},
	}
	return cmd
}
