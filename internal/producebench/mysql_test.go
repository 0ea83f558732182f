package producebench

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestMySQLRunner runs each variant briefly on MariaDB/MySQL and checks
// the rows each wrote: one order per transaction, one outbox row per
// transaction of (b) and (c), Ferry's with sequence 1 (a fresh aggregate).
func TestMySQLRunner(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	ctx := context.Background()
	tables := ferry.Tables{Prefix: "pb_"}
	if err := SetupMySQL(ctx, d.DB, tables); err != nil {
		t.Fatal(err)
	}
	r, err := NewMySQL(d.DB, tables)
	if err != nil {
		t.Fatal(err)
	}
	var total, events int64
	for _, v := range Variants {
		res, err := r.Measure(ctx, v, 4, 300*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if res.Txns == 0 || res.TxPerSec <= 0 {
			t.Fatalf("%s: %+v", v, res)
		}
		total += res.Txns
		if v != BusinessOnly {
			events += res.Txns
		}
	}
	var orders, rows, bad int64
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM bench_orders`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if err := d.DB.QueryRow(`SELECT COUNT(*), COALESCE(SUM(aggregate_seq <> 1), 0) FROM pb_outbox`).Scan(&rows, &bad); err != nil {
		t.Fatal(err)
	}
	if orders != total || rows != events || bad != 0 {
		t.Fatalf("orders %d (want %d), outbox rows %d (want %d), rows with seq <> 1: %d", orders, total, rows, events, bad)
	}
	if _, err := r.Measure(ctx, OutboxMax, 1, time.Millisecond); err == nil {
		t.Fatal("a Postgres reference variant ran on MySQL")
	}
}
