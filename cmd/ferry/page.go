package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

// addAfterFlag registers --after, the cursor of a listing's next page.
func addAfterFlag(cmd *cobra.Command, after *string) {
	cmd.Flags().StringVar(after, "after", "", "list the page after this cursor (next_cursor of the previous page)")
}

// printPage prints one page of a listing: --json as {"rows", "next_cursor",
// "total"}, text as the rows with the total and the next page's flag.
func printPage[T any](w io.Writer, asJSON bool, p ops.Page[T], noun string, printRows func(io.Writer, []T)) error {
	if asJSON {
		if p.Rows == nil {
			p.Rows = []T{}
		}
		return printJSON(w, p)
	}
	total := fmt.Sprint(p.Total)
	if p.TotalCapped {
		total += "+" // counted up to ops.CountCap
	}
	fmt.Fprintf(w, "%d %s (total %s)\n", len(p.Rows), noun, total)
	if len(p.Rows) > 0 {
		printRows(w, p.Rows)
	}
	if p.NextCursor != "" {
		fmt.Fprintf(w, "more: run again with --after %s\n", p.NextCursor)
	}
	return nil
}
