package ops_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/ops"
)

// TestStatusCountCap (Postgres): with a cap above every count, the bounded
// outbox section reads exactly what the exact one reads (shards, topics,
// totals, oldest pending age); with a cap of 5, a shard with more dead
// letters reports 5 and is marked capped, and so are its topic and the
// totals, while a shard under the cap keeps its exact numbers.
func TestStatusCountCap(t *testing.T) {
	e := newPostgres(t)
	ctx := context.Background()
	var evs []ferry.Event
	for i := range 60 {
		evs = append(evs, event(fmt.Sprint("cap-", i), "order.created"))
	}
	evs = e.insert(t, evs...)
	// Dead letters: 20 of them, one discarded; 10 sent; the rest pending.
	for i, ev := range evs[:30] {
		switch {
		case i < 20:
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'dead' WHERE event_id = $1`, tn("outbox")), ev.ID.String())
		default:
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = created_at WHERE event_id = $1`, tn("outbox")), ev.ID.String())
		}
	}
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET discarded_at = created_at WHERE event_id = $1`, tn("outbox")), evs[0].ID.String())

	exact, err := e.ops.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bounded, err := e.ops.Status(ctx, ops.WithCountCap(1000))
	if err != nil {
		t.Fatal(err)
	}
	if exact.Outbox.Pending != 30 || exact.Outbox.Dead != 19 || exact.Outbox.Discarded != 1 {
		t.Fatalf("exact totals %+v", exact.Outbox)
	}
	eo, bo := exact.Outbox, bounded.Outbox
	if math.Abs(eo.OldestPendingAge-bo.OldestPendingAge) > 1 || bo.CountsCapped {
		t.Fatalf("totals: exact %+v, bounded %+v", eo, bo)
	}
	eo.OldestPendingAge, bo.OldestPendingAge = 0, 0
	if eo != bo || len(exact.Shards) != len(bounded.Shards) || len(exact.Topics) != len(bounded.Topics) {
		t.Fatalf("exact %+v %+v, bounded %+v %+v", eo, exact.Shards, bo, bounded.Shards)
	}
	for i := range exact.Shards {
		a, b := exact.Shards[i], bounded.Shards[i]
		if a.Topic != b.Topic || a.Shard != b.Shard || a.Pending != b.Pending || a.Dead != b.Dead || b.CountsCapped ||
			math.Abs(a.OldestPendingAge-b.OldestPendingAge) > 1 || a.LeaseOwner != b.LeaseOwner {
			t.Fatalf("shard %d: exact %+v, bounded %+v", i, a, b)
		}
	}

	capped, err := e.ops.Status(ctx, ops.WithCountCap(5))
	if err != nil {
		t.Fatal(err)
	}
	sawCapped := false
	for i, s := range capped.Shards {
		x := exact.Shards[i]
		if s.Pending != min(x.Pending, 5) || s.Dead != min(x.Dead, 5) || s.CountsCapped != (x.Pending > 5 || x.Dead > 5) {
			t.Fatalf("shard %d with cap 5: %+v, exact %+v", s.Shard, s, x)
		}
		sawCapped = sawCapped || s.CountsCapped
	}
	if !sawCapped || !capped.Outbox.CountsCapped || !capped.Topics[0].CountsCapped {
		t.Fatalf("no capped shard/topic/total with cap 5: %+v %+v", capped.Outbox, capped.Shards)
	}
}
