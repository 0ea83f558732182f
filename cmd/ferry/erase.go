package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/ops"
)

func newEraseCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var req ops.EraseRequest
	cmd := &cobra.Command{
		Use:   "erase --tenant T --subject S",
		Short: "Crypto-shred one data subject: destroy its data key, so every copy of its encrypted payloads is unreadable",
		Long: `erase destroys the data key of one data subject (the subject an event type
encrypted per subject names, e.g. a customer id; see docs/ENCRYPTION.md).
Every payload sealed under that key becomes unreadable wherever a copy
lives: outbox rows, broker streams, archives, parked inbox rows. Event ids,
sequences, receipts and the audit trail stay, so dedup and order still
work; consumers park such events with reason decrypt.

It previews by default (the subject's keys: live and already erased) and
acts only with --approve; the action writes an audit row (--reason is
required, --actor defaults to $USER) that records the tenant and the
subject's SHA-256 digest, never its name. Irreversible.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Subject == "" {
				return fmt.Errorf("--subject: required (the subject the events name)")
			}
			if req.TenantID == "" {
				return fmt.Errorf("--tenant: required (the events' tenant_id)")
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			res, err := o.EraseSubject(cmd.Context(), req, af.approval())
			if err != nil {
				return err
			}
			return printAction(cmd.OutOrStdout(), f.json, res, "live subject key(s) would be destroyed", "subject key(s) destroyed", printSubjectKeys)
		},
	}
	f.register(cmd)
	af.register(cmd)
	cmd.Flags().StringVar(&req.TenantID, "tenant", "", "tenant of the subject (required)")
	cmd.Flags().StringVar(&req.Subject, "subject", "", "the data subject, as the producer's encrypt.Rule.Subject names it (required)")
	return cmd
}

func printSubjectKeys(w io.Writer, keys []encrypt.SubjectKey) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HANDLE\tTENANT\tKEYRING KEY\tCREATED\tERASED")
	for _, k := range keys {
		erased := "-"
		if k.ErasedAt != nil {
			erased = ts(k.ErasedAt)
		}
		kek := k.KEKID
		if kek == "" {
			kek = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Handle, k.TenantID, kek, ts(&k.CreatedAt), erased)
	}
	_ = tw.Flush()
}
