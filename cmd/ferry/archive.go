package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sort"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/archive"
)

func newArchiveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "archive",
		Short: "Check and read back what 'ferry cleanup --archive' wrote",
		Long: `archive works on a blob store written by 'ferry cleanup --archive URL':
one gzip NDJSON object and one JSON manifest per cleanup batch (see
docs/ARCHIVE.md). file:///DIR is built in; s3://, gs:// and azblob:// need
a build that blank-imports the driver.`,
	}
	cmd.AddCommand(newArchiveVerifyCmd(), newArchiveRestoreCmd())
	return cmd
}

func newArchiveVerifyCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify URL",
		Short: "Re-read every archived object and check its sha256, size, row count and id range against its manifest",
		Long: `verify lists the archive, reads every manifest and the object it names,
and checks that the object is there, that its size and sha256 match the
manifest, that it decodes, holds the manifest's row count and only ids in
its range. It exits non-zero naming each missing or corrupted object.

Data objects without a manifest are reported as unconfirmed: a cleanup
wrote them but never confirmed the batch, so their rows were not deleted.`,
		Example: `  ferry archive verify "file:///var/lib/ferry/archive"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			st, err := archive.Open(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			rep, verr := st.Verify(cmd.Context())
			if verr != nil && !errors.Is(verr, archive.ErrVerifyFailed) {
				return verr
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(w, rep); err != nil {
					return err
				}
				return verr
			}
			for _, p := range rep.Problems {
				fmt.Fprintf(w, "FAIL %-10s %s: %s\n", p.Kind, p.Object+orManifest(p), p.Detail)
			}
			for _, u := range rep.Unconfirmed {
				fmt.Fprintf(w, "note unconfirmed %s: no manifest (its batch was never confirmed, its rows were not deleted)\n", u)
			}
			tables := make([]string, 0, len(rep.ByTable))
			for t := range rep.ByTable {
				tables = append(tables, t)
			}
			sort.Strings(tables)
			fmt.Fprintf(w, "%s: %d of %d objects verified, %d rows", rep.Location, rep.Verified, rep.Manifests, rep.Rows)
			for _, t := range tables {
				fmt.Fprintf(w, ", %s %d", t, rep.ByTable[t])
			}
			fmt.Fprintln(w)
			return verr
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func orManifest(p archive.Problem) string {
	if p.Object == "" {
		return p.Manifest
	}
	return ""
}

func newArchiveRestoreCmd() *cobra.Command {
	var f opsFlags
	var af approvalFlags
	var into string
	cmd := &cobra.Command{
		Use:   "restore URL --into DATABASE_URL",
		Short: "Write archived rows back into Ferry's tables of a database (idempotent)",
		Long: `restore verifies the whole archive first (as 'ferry archive verify' does)
and refuses a corrupted or incomplete one. It then writes every archived
row back into the Ferry table it came from (outbox, inbox, inbox_parked,
effects) of the database given by --into, migrated with 'ferry migrate up':
with its original id and values. Outbox rows come back as they were
deleted — sent — so the relay does not publish them again; re-publishing
is a separate, explicit 'ferry replay'.

A row whose primary or unique key is already in the table is skipped and
counted as present, so restoring twice inserts nothing the second time.
The archive may come from another dialect (SQLite into Postgres works).

Typical uses: a scratch database to inspect old events with 'ferry
evidence', search or the console; or the live database after a cleanup
deleted rows that are needed again.

Previews (counts) by default; --approve writes and records an audit row.`,
		Example: `  ferry archive restore "file:///var/lib/ferry/archive" --into postgres://localhost/forensics
  ferry archive restore "file:///var/lib/ferry/archive" --into postgres://localhost/forensics --approve --reason "INC-42: inspect October's events"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			if into != "" {
				f.store.url = into
			}
			if f.store.url == "" {
				return errors.New("--into DATABASE_URL is required: the database to restore into (postgres://…, mysql://… or sqlite:PATH)")
			}
			st, err := archive.Open(cmd.Context(), args[0], archive.WithFerryVersion(version(debug.ReadBuildInfo())))
			if err != nil {
				return err
			}
			defer st.Close()
			rep, err := st.Verify(cmd.Context())
			if err != nil {
				return fmt.Errorf("archive restore: refusing to restore from an archive that does not verify (run 'ferry archive verify %s'): %w", args[0], err)
			}
			s, o, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			res, err := o.RestoreArchive(cmd.Context(), st.Batches(cmd.Context()), st.Location(), af.approval())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if f.json {
				return printJSON(w, res)
			}
			if res.DryRun {
				fmt.Fprintf(w, "DRY RUN: would restore up to %d rows from %d objects (verified: %d rows); rows already present are skipped. Re-run with --approve --reason \"…\".\n",
					res.Rows, res.Objects, rep.Rows)
			} else {
				fmt.Fprintf(w, "restored %d rows from %d objects; %d were already present and left as they are (audit #%d)\n", res.Inserted, res.Objects, res.Present, res.AuditID)
			}
			return nil
		},
	}
	f.register(cmd)
	af.register(cmd)
	cmd.Flags().StringVar(&into, "into", "", "the database to restore into (postgres://…, mysql://… or sqlite:PATH; default --database-url)")
	return cmd
}
