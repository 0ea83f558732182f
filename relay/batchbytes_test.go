package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
)

// TestMaxBatchBytes: 48 events of 10 KiB over 8 aggregates and 4 shards,
// drained by one worker with a 40 KiB batch budget (a 10 KiB share per
// shard): no batch the broker is handed holds more than 40 KiB of
// payload, and the broker holds every event once, per aggregate in order,
// on every store and both state designs. The negative control drains the
// same backlog with the default budget: its batches exceed 40 KiB.
func TestMaxBatchBytes(t *testing.T) {
	const budget, size, events = 40 << 10, 10 << 10, 48
	eachStore(t, allStores(), func(t *testing.T, newStore newStoreFunc) {
		for _, limited := range []bool{true, false} {
			name := "budget_40KiB"
			if !limited {
				name = "control_default_budget"
			}
			t.Run(name, func(t *testing.T) {
				s := newStore(t, 4)
				n := startEmbeddedNATS(t)
				ctx := context.Background()
				fill := strings.Repeat("x", size-len(`{"v":""}`))
				var want []ferry.Event
				for i := 0; i < events; i += 12 {
					var evs []ferry.Event
					for j := i; j < i+12; j++ {
						evs = append(evs, ev(fmt.Sprintf("agg-%d", j%8), fill))
					}
					got, err := s.insert(ctx, evs...)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, got...)
				}
				var mu sync.Mutex
				maxBytes, batches := 0, 0
				hook := func(_ context.Context, evs []ferry.Event) error {
					b := 0
					for _, e := range evs {
						b += len(e.Payload)
					}
					mu.Lock()
					defer mu.Unlock()
					batches++
					maxBytes = max(maxBytes, b)
					return nil
				}
				opts := fastOpts(4, WithWorkers(1), WithFaults(Faults{BeforePublish: hook}))
				if limited {
					opts = append(opts, WithMaxBatchBytes(budget))
				}
				r, err := s.newRelay(n.publisher(t), opts...)
				if err != nil {
					t.Fatal(err)
				}
				stop := runRelay(t, r)
				waitFor(t, 60*time.Second, "all sent", func() bool { return s.count(t, "sent") == events })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				checkBroker(t, n.read(t), want)
				mu.Lock()
				defer mu.Unlock()
				t.Logf("%d batches, the largest %d payload bytes", batches, maxBytes)
				if limited && maxBytes > budget {
					t.Errorf("a batch held %d payload bytes; budget %d", maxBytes, budget)
				}
				if !limited && maxBytes <= budget {
					t.Errorf("control: the largest batch held %d bytes, within %d: the test cannot tell the budget from its absence", maxBytes, budget)
				}
				// The claim's LIMIT followed the payloads: 10 KiB rows
				// and a 10 KiB share per shard ask for 2 rows a shard
				// (the one kept and the one that shows there is more),
				// not the batch size's 500.
				if got := r.rowBytes.Load(); got != size {
					t.Errorf("mean payload of the last claim %d, want %d", got, size)
				}
				if per := r.claimPer(4); limited && per != 2 {
					t.Errorf("claim LIMIT per shard %d with a 10 KiB share and 10 KiB rows, want 2", per)
				} else if want := min(r.cfg.claimSize()/4, DefaultMaxBatchBytes/4/size+1); !limited && per != want {
					t.Errorf("control: claim LIMIT per shard %d, want %d (the 16 MiB budget's 4 MiB share of 10 KiB rows)", per, want)
				}
			})
		}
	})
}

// TestClaimPer: the claim's LIMIT per shard is the batch size's share
// until a claim has seen the payloads, then what the byte share takes.
func TestClaimPer(t *testing.T) {
	r := &Relay{cfg: defaultConfig()}
	r.cfg.batch, r.cfg.batchBytes = 2000, 4<<20
	if got := r.claimPer(4); got != 500 {
		t.Errorf("before any claim: %d, want 500", got)
	}
	r.rowBytes.Store(300) // small rows: the batch size binds
	if got := r.claimPer(4); got != 500 {
		t.Errorf("300-byte rows: %d, want 500", got)
	}
	r.rowBytes.Store(100_000) // 1 MiB share / 100 KB + 1
	if got := r.claimPer(4); got != 11 {
		t.Errorf("100 KB rows: %d, want 11", got)
	}
	r.rowBytes.Store(8 << 20) // a row larger than the share: still one (plus one)
	if got := r.claimPer(4); got != 1 {
		t.Errorf("8 MiB rows: %d, want 1", got)
	}
}

// TestCutShardsKeepsPrefix: a shard's rows after its first row left out are
// dropped whatever order the claim returned them in, so every aggregate
// keeps a prefix of its rows; other shards are untouched.
func TestCutShardsKeepsPrefix(t *testing.T) {
	row := func(id int64, shard int, agg string, seq int64) claimed {
		c := claimed{id: id}
		c.ev.Shard, c.ev.AggregateID, c.ev.AggregateSeq = shard, agg, seq
		return c
	}
	b := []claimed{row(7, 0, "a", 3), row(3, 0, "a", 1), row(9, 1, "b", 1), row(5, 0, "a", 2), row(11, 1, "b", 2)}
	got := cutShards(b, map[int]int64{0: 5})
	var ids []int64
	for _, c := range got {
		ids = append(ids, c.id)
	}
	if fmt.Sprint(ids) != "[3 9 11]" {
		t.Fatalf("cut at id 5 of shard 0 kept %v, want [3 9 11]", ids)
	}
	if out := cutShards(b[:2], nil); len(out) != 2 {
		t.Fatalf("no cut dropped rows: %d left", len(out))
	}
}

// TestMaxBatchBytesOption: the option's validation names the field and the
// limit.
func TestMaxBatchBytesOption(t *testing.T) {
	for _, n := range []int{0, -1, MaxMaxBatchBytes + 1} {
		err := CheckOptions(WithMaxBatchBytes(n))
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != "max_batch_bytes" || !strings.Contains(err.Error(), fmt.Sprint(MaxMaxBatchBytes)) {
			t.Errorf("WithMaxBatchBytes(%d): %v, want a ConfigError on max_batch_bytes naming %d", n, err, MaxMaxBatchBytes)
		}
	}
	if err := CheckOptions(WithMaxBatchBytes(1)); err != nil {
		t.Errorf("WithMaxBatchBytes(1) refused: %v", err)
	}
}
