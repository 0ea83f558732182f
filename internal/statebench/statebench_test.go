package statebench

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// A short run of every design: the figures are present, the marks did
// what each design says (checkMarked, per round), and the physics the
// design decision rests on shows: today's status mark is never HOT, the
// same mark on an unindexed column is HOT once the page has room
// (fillfactor 50), and a watermark writes far less WAL than a row update.
func TestRunMeasuresEveryDesign(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills six scratch outboxes")
	}
	s := testenv.NewPostgresSchema(t)
	var progress strings.Builder
	res, err := Run(context.Background(), s.Pool, Config{Marked: 3000, Batch: 64, Batches: 2, Rounds: 2, Payload: 300, Aggregates: 50, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Result{}
	for _, r := range res {
		by[r.Variant] = r
		if r.MicrosPer <= 0 || r.LSNBytes < 0 || r.InsertWAL <= 0 || len(r.Rounds) != 2 {
			t.Errorf("%s: %+v", r.Variant, r)
		}
		if r.Variant != COPYState && (r.WALBytes <= 0 || r.WALRecords <= 0) {
			t.Errorf("%s: mark WAL %v bytes, %v records per event", r.Variant, r.WALBytes, r.WALRecords)
		}
		// 16 shards × 4 rows, pending rows in every shard of 50 aggregates.
		if r.Claim.Rows <= 0 || r.Claim.SharedHit+r.Claim.SharedRead <= 0 {
			t.Errorf("%s: claim %+v", r.Variant, r.Claim)
		}
		if r.ClaimCursor != nil && r.ClaimCursor.Rows != r.Claim.Rows {
			t.Errorf("%s: cursor claim found %d rows, plain %d", r.Variant, r.ClaimCursor.Rows, r.Claim.Rows)
		}
	}
	if len(by) != len(Variants) {
		t.Fatalf("results for %d designs, want %d", len(by), len(Variants))
	}
	if h := by[StatusUpdate].HOTShare; h == nil || *h != 0 {
		t.Errorf("status mark HOT share %v, want 0", h)
	}
	if h := by[HOTMarkFF50].HOTShare; h == nil || *h < 0.9 {
		t.Errorf("HOT mark at fillfactor 50: HOT share %v, want >= 0.9", h)
	}
	if a, d := by[StatusUpdate].WALBytes, by[Watermark].WALBytes; d*10 > a {
		t.Errorf("watermark WAL %v B/event not an order below the status mark's %v", d, a)
	}
	if !strings.Contains(progress.String(), "round 2 ") {
		t.Errorf("progress lacks round 2:\n%s", progress.String())
	}
}

// Negative control for checkMarked: rows that were inserted but not
// marked are reported, in every design's terms.
func TestCheckMarkedRefusesUnmarkedRows(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	cfg := Config{Marked: 10, Batch: 16, Batches: 2, Rounds: 1, Payload: 10, Aggregates: 5}
	for _, v := range []string{StatusUpdate, HOTMark, StateTable, Watermark} {
		d, err := setup(ctx, s.Pool, v, cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		// setup's pending rows (ids 11..74) are not marked.
		if err := checkMarked(ctx, conn.Conn(), d, v, 11, d.lastID, int(d.lastID)-10); err == nil {
			t.Errorf("%s: checkMarked accepted unmarked rows", v)
		}
		if err := checkMarked(ctx, conn.Conn(), d, v, 1, 10, 10); err != nil {
			t.Errorf("%s: the pre-marked rows: %v", v, err)
		}
	}
}
