package producebench

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/testenv"
)

// Every variant writes what its name says — otherwise the benchmark would
// compare the wrong things.
func TestVariantsWriteWhatTheySay(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	if err := Setup(ctx, s.Pool, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	r, err := New(s.Pool, ferry.Tables{}, "")
	if err != nil {
		t.Fatal(err)
	}
	count := func(table string) int {
		var n int
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		v                     Variant
		orders, events, seqRo int
	}{
		{BusinessOnly, 1, 0, 0},
		{HandWritten, 1, 1, 0},
		{FerrySequenced, 1, 1, 1},
		{FerryShapeNoSeq, 1, 1, 0},
		{OnConflictFloor, 1, 1, 0},
		{OutboxMax, 1, 1, 0},
	} {
		o0, e0, q0 := count("bench_orders"), count("ferry_outbox"), count("ferry_aggregate_seq")
		if err := r.Run(ctx, tc.v); err != nil {
			t.Fatalf("%s: %v", tc.v, err)
		}
		o, e, q := count("bench_orders")-o0, count("ferry_outbox")-e0, count("ferry_aggregate_seq")-q0
		if o != tc.orders || e != tc.events || q != tc.seqRo {
			t.Errorf("%s wrote %d orders, %d events, %d sequence rows; want %d, %d, %d", tc.v, o, e, q, tc.orders, tc.events, tc.seqRo)
		}
	}
	var bad int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_outbox WHERE aggregate_seq <> 1`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Errorf("%d events of fresh orders have a sequence other than 1", bad)
	}
	if err := r.Run(ctx, "no_such_variant"); err == nil {
		t.Error("an unknown variant ran")
	}

	res, err := r.Measure(ctx, HandWritten, 2, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Txns == 0 || res.TxPerSec <= 0 {
		t.Fatalf("measure: %+v", res)
	}
	if ReadCPU().Client >= 0 && res.ClientCPUPerTx <= 0 {
		t.Errorf("client CPU per transaction not measured: %+v", res)
	}
}
