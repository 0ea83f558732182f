package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
)

// ferry parked list pages through 2,500 rows 1,000 at a time: --json
// carries rows, next_cursor and total; following --after reads every row
// once in 3 pages; the text form names the total and the next --after.
func TestParkedListPagingCLI(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO ferry_inbox_parked (consumer, reason, park_key, first_seen, last_seen, aggregate_type, aggregate_id, aggregate_seq)
		SELECT 'billing', 'gap', 'k' || i, now(), now(), 'order', 'a' || i, i FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	after, pages := "", 0
	for {
		args := []string{"parked", "list", "--consumer", "billing", "--limit", "1000", "--json", "--database-url", s.URL}
		if after != "" {
			args = append(args, "--after", after)
		}
		out, err := runCLI(t, args...)
		if err != nil {
			t.Fatalf("page %d: %v\n%s", pages+1, err, out)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &raw); err != nil {
			t.Fatalf("page %d: not a JSON object: %v\n%.300s", pages+1, err, out)
		}
		for _, k := range []string{"rows", "next_cursor", "total"} {
			if _, ok := raw[k]; !ok {
				t.Fatalf("page %d: JSON lacks %q", pages+1, k)
			}
		}
		var p ops.Page[ops.ParkedMessage]
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatal(err)
		}
		pages++
		if p.Total != 2500 {
			t.Fatalf("page %d: total %d", pages, p.Total)
		}
		for _, r := range p.Rows {
			if seen[r.ID] {
				t.Fatalf("row %d on two pages", r.ID)
			}
			seen[r.ID] = true
		}
		if p.NextCursor == "" || pages > 4 {
			break
		}
		after = p.NextCursor
	}
	if pages != 3 || len(seen) != 2500 {
		t.Fatalf("%d pages, %d distinct rows; want 3, 2500", pages, len(seen))
	}
	out, err := runCLI(t, "parked", "list", "--consumer", "billing", "--database-url", s.URL)
	if err != nil || !strings.Contains(out, "1000 parked message(s) (total 2500)") || !strings.Contains(out, "--after ") {
		t.Fatalf("text page: %v\n%.400s", err, out)
	}
	if out, err := runCLI(t, "parked", "list", "--after", "nope", "--database-url", s.URL); err == nil || !strings.Contains(err.Error(), "after") {
		t.Fatalf("bad cursor accepted: %v\n%s", err, out)
	}
	out, err = runCLI(t, "dlq", "list", "--json", "--database-url", s.URL)
	var dp ops.Page[ops.OutboxMessage]
	if err != nil || json.Unmarshal([]byte(out), &dp) != nil || dp.Rows == nil || dp.Total != 0 || dp.NextCursor != "" {
		t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
}
