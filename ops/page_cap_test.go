package ops_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/ops"
)

// TestListTotalCapped: a listing's Total counts up to ops.CountCap; with
// one row more it reports CountCap and TotalCapped (a lower bound), while
// the action preview still reports the exact rows of its batch.
func TestListTotalCapped(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		seedParked(t, e, ops.CountCap) // + one for consumer shipping
		p, err := e.ops.ListParkedPage(ctx, ops.ParkedFilter{Consumer: "billing", Limit: 10})
		if err != nil || p.Total != ops.CountCap || p.TotalCapped {
			t.Fatalf("exactly CountCap rows: total %d capped %v, %v", p.Total, p.TotalCapped, err)
		}
		p, err = e.ops.ListParkedPage(ctx, ops.ParkedFilter{Limit: 10})
		if err != nil || p.Total != ops.CountCap || !p.TotalCapped || len(p.Rows) != 10 || p.NextCursor == "" {
			t.Fatalf("CountCap+1 rows: total %d capped %v rows %d cursor %q, %v", p.Total, p.TotalCapped, len(p.Rows), p.NextCursor, err)
		}
		res, err := e.ops.RequestReplay(ctx, ops.ParkedFilter{Consumer: "shipping"}, ops.Approval{})
		if err != nil || !res.DryRun || res.Rows != 1 || res.More {
			t.Fatalf("preview: %+v, %v", res, err)
		}
	})
}
