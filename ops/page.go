package ops

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ferryhq/ferry/driver"
)

// Page is one page of a listing, in id order. Pass NextCursor as the
// filter's After to read the next page; it is empty on the last page.
// Total is how many rows match the filter on all pages, counted just
// before the page is read, up to CountCap: when more match, Total is
// CountCap and TotalCapped is set (show "10,000+"). An exact count of a
// broad filter would read every matching row — 100,000 dead letters of a
// tenant cost over a second — for a number nobody pages through; the
// action previews (RetryDead etc. without approval) still report the exact
// rows they would change.
//
// Paging is by key (id > cursor ORDER BY id LIMIT n), not OFFSET: a page
// costs the same wherever it starts, and rows added or resolved between
// pages neither repeat nor shift the rows of later pages.
type Page[T any] struct {
	Rows       []T    `json:"rows"`
	NextCursor string `json:"next_cursor"`
	Total      int64  `json:"total"`
	// TotalCapped says Total is a lower bound: more than CountCap rows
	// match.
	TotalCapped bool `json:"total_capped,omitempty"`
}

// CountCap bounds the Total of a listing page.
const CountCap = 10_000

// parseCursor reads a filter's After: "" is the start, otherwise the
// NextCursor of an earlier page (a row id).
func parseCursor(after string) (int64, error) {
	if after == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(after, 10, 64)
	if err != nil || id < 0 {
		return 0, &ArgError{Field: "filter.after", Reason: fmt.Sprintf("not a cursor from an earlier page (next_cursor): %q", after)}
	}
	return id, nil
}

// refuseCursor keeps After out of actions: they always take the first
// matching rows in id order.
func refuseCursor(after string) error {
	if after != "" {
		return &ArgError{Field: "filter.after", Reason: "applies to listings only; narrow an action with ids or a filter"}
	}
	return nil
}

// listPage reads one page of table's rows matching w after the cursor,
// and the total matching w up to CountCap (two statements, no lock: SQLite's
// transactions take the write lock). query reads rows with the
// given SQL; id returns a row's id.
func listPage[T any](ctx context.Context, o *Ops, table string, w *where, after string, limit int,
	query func(exec driver.Executor, sql string, args ...any) ([]T, error), cols string, id func(T) int64) (Page[T], error) {
	from, err := parseCursor(after)
	if err != nil {
		return Page[T]{}, err
	}
	var p Page[T]
	exec := o.db.Executor()
	// count(*) over a LIMITed subquery stops reading at CountCap+1 rows.
	if _, err := driver.QueryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 AS one FROM %s WHERE %s LIMIT %d) capped`,
		o.t(table), w.sql(), CountCap+1), w.args, &p.Total); err != nil {
		return Page[T]{}, fmt.Errorf("ops: count %s: %w", table, err)
	}
	if p.Total > CountCap {
		p.Total, p.TotalCapped = CountCap, true
	}
	pw := &where{conds: append([]string(nil), w.conds...), args: append([]any(nil), w.args...)}
	pw.add("id > ?", from)
	rows, err := query(exec, fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY id LIMIT %d`, cols, o.t(table), pw.sql(), limit+1), pw.args...)
	if err != nil {
		return Page[T]{}, err
	}
	if len(rows) > limit {
		rows = rows[:limit]
		p.NextCursor = strconv.FormatInt(id(rows[limit-1]), 10)
	}
	p.Rows = rows
	if p.Rows == nil {
		p.Rows = []T{}
	}
	return p, nil
}
