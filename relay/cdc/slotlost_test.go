package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/relay/cdc"
)

// TestSlotInvalidatedByWALLimit has Postgres itself invalidate the slot
// (wal_status = lost) while the relay is stopped — max_slot_wal_keep_size
// lowered and WAL written past it — and checks that the relay detects the
// loss, says so, recreates the slot and re-publishes from the table every
// row committed meanwhile. TestSlotDroppedWhileStopped covers the dropped
// slot and its negative control; this one covers the invalidation path.
//
// It changes a server-wide setting (ALTER SYSTEM), which would invalidate
// the slots of CDC tests running at the same time, so it runs on a
// throwaway Postgres cluster of its own (initdb in a temp dir, its own
// port, removed afterwards), never on the shared server.
func TestSlotInvalidatedByWALLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Postgres cluster of its own")
	}
	ctx := context.Background()
	pg := testenv.NewThrowawayPostgres(t, map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": "8",
		"max_wal_senders":       "8",
		"max_wal_size":          "32MB",
		"min_wal_size":          "32MB",
	})
	t.Logf("throwaway Postgres on port %d", pg.Port)
	h := newHarnessOn(t, testenv.NewPostgresSchemaAt(t, pg.URL))
	pool := h.s.Pool
	n := startNATS(t, 0)
	_, stop := h.start(n.publisher())
	before := h.insert(ctx, 10, 3)
	n.read(60*time.Second, allDelivered(before))
	waitFor(t, 60*time.Second, "rows marked sent", func() bool { return h.statusCounts(ctx)["sent"] == 10 })
	stop()
	while := h.insert(ctx, 15, 3)

	setKeep := func(v string) error {
		q := "ALTER SYSTEM RESET max_slot_wal_keep_size"
		if v != "" {
			q = fmt.Sprintf("ALTER SYSTEM SET max_slot_wal_keep_size = '%s'", v)
		}
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, "SELECT pg_reload_conf()")
		return err
	}
	t.Cleanup(func() {
		if err := setKeep(""); err != nil {
			t.Errorf("reset max_slot_wal_keep_size: %v", err)
		}
	})
	if err := setKeep("1MB"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "max_slot_wal_keep_size reloaded", func() bool {
		var v string
		return pool.QueryRow(ctx, "SHOW max_slot_wal_keep_size").Scan(&v) == nil && v == "1MB"
	})
	if _, err := pool.Exec(ctx, `CREATE TABLE walfill (n int, pad text)`); err != nil {
		t.Fatal(err)
	}
	status := ""
	for i := 0; i < 20 && status != "lost"; i++ {
		// About 3 MB of WAL, a segment switch, and a checkpoint: the
		// checkpointer invalidates slots that retain more than the limit.
		for _, q := range []string{
			`INSERT INTO walfill SELECT g, repeat('x', 1000) FROM generate_series(1, 3000) g`,
			`SELECT pg_switch_wal()`,
			`CHECKPOINT`,
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if err := pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, h.slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("slot %s invalidated by Postgres (wal_status=%s)", h.slot, status)
	if status != "lost" {
		t.Fatalf("slot wal_status = %q after writing WAL past max_slot_wal_keep_size; want lost", status)
	}
	if err := setKeep(""); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	r, _ := h.start(n.publisher(), cdc.WithRegisterer(reg))
	after := h.insert(ctx, 5, 3)
	all := append(append(before, while...), after...)
	got := n.read(60*time.Second, allDelivered(all))
	if v := judge(all, got); v.lost != 0 || v.orderViolations != 0 || v.phantom != 0 {
		t.Fatalf("after the slot was invalidated: %+v", v)
	}
	if st := r.Status(); st.SlotLosses != 1 {
		t.Fatalf("Status().SlotLosses = %d, want 1", st.SlotLosses)
	}
	if got := gather(t, reg, "ferry_cdc_slot_lost_total"); got != 1 {
		t.Fatalf("ferry_cdc_slot_lost_total = %v, want 1", got)
	}
	if got := gather(t, reg, "ferry_cdc_catchup_events_total"); got != 15 {
		t.Errorf("ferry_cdc_catchup_events_total = %v, want 15 (the rows committed while the relay was stopped)", got)
	}
	info, err := cdc.Inspect(ctx, pool, h.tables, h.slot)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Exists || info.WALStatus == "lost" || info.LostCount != 1 || !strings.Contains(info.LastError, "wal_status=lost") {
		t.Fatalf("Inspect after recovery: %+v; want a recreated slot, lost_count 1, the reason recorded", info)
	}
	t.Logf("recovered: %s", info.LastError)
	waitFor(t, 60*time.Second, "all rows sent", func() bool { return h.statusCounts(ctx)["sent"] == len(all) })
}
