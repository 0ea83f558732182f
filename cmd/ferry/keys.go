package main

import (
	"fmt"
	"sort"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/encrypt"
)

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage the keys of encrypted payloads (see docs/ENCRYPTION.md)",
	}
	cmd.AddCommand(newKeysRewrapCmd())
	return cmd
}

func newKeysRewrapCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var keyringFile string
	var batch int
	cmd := &cobra.Command{
		Use:   "rewrap --keyring FILE",
		Short: "Re-wrap every live subject key under the keyring's current KEK, so old KEKs can be retired",
		Long: `rewrap unwraps every live subject key wrapped under a KEK other than the
keyring's current one and wraps the same data key under the current KEK,
updating its row in place: every payload sealed under it still opens, and a
keyring without the old KEK opens it afterwards. Erased subjects stay
erased. Batches of --batch-size keys, each its own transaction; safe to
re-run. Per-event data keys (mode event) live inside the payloads and are
not re-wrapped.

It previews by default (counts by KEK) and acts only with --approve; the
action writes an audit row (--reason is required, --actor defaults to $USER).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyringFile == "" {
				return fmt.Errorf("--keyring: required (the keyring file holding the old and the current KEK)")
			}
			ring, err := encrypt.LoadKeyringFile(keyringFile)
			if err != nil {
				return fmt.Errorf("--keyring: %w", err)
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			res, err := o.RewrapSubjectKeys(cmd.Context(), ring, batch, af.approval())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			if res.DryRun {
				fmt.Fprintf(w, "DRY RUN %s: %d subject key(s) would be re-wrapped under %s. Re-run with --approve --reason \"…\" to act.\n", res.Action, res.Rows, res.To)
			} else {
				fmt.Fprintf(w, "%s: %d subject key(s) re-wrapped under %s in %d batches (audit #%d)\n", res.Action, res.Rows, res.To, res.Batches, res.AuditID)
			}
			ids := make([]string, 0, len(res.From))
			for k := range res.From {
				ids = append(ids, k)
			}
			sort.Strings(ids)
			for _, k := range ids {
				fmt.Fprintf(w, "  from %s: %d\n", k, res.From[k])
			}
			return nil
		},
	}
	f.register(cmd)
	af.register(cmd)
	cmd.Flags().StringVar(&keyringFile, "keyring", "", "keyring file (encrypt.LoadKeyringFile; mode 0600) with the old KEKs and the current one (required)")
	cmd.Flags().IntVar(&batch, "batch-size", encrypt.DefaultRewrapBatch, "subject keys per transaction")
	return cmd
}
