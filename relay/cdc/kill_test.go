package cdc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/relay/cdc"
)

// The SIGKILL test re-executes the test binary as a relay process; TestMain
// sees childEnv and runs runChild instead of the tests.
const childEnv = "FERRY_CDC_CHILD"

func runChild() int {
	get := func(k string) string { return os.Getenv(childEnv + "_" + k) }
	p, err := kafka.NewPublisher(strings.Split(get("SEEDS"), ","), kafka.WithDeliveryTimeout(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer p.Close()
	opts := []cdc.Option{
		cdc.WithTables(ferry.Tables{Schema: get("SCHEMA")}), cdc.WithSlotName(get("SLOT")), cdc.WithPublicationName(get("PUB")),
		cdc.WithStandbyTimeout(100 * time.Millisecond), cdc.WithAcquireInterval(50 * time.Millisecond),
		cdc.WithBackoff(20*time.Millisecond, 200*time.Millisecond), cdc.WithLogger(testLogger()),
	}
	// Optional knobs of the convergence test (converge_test.go).
	if d, err := time.ParseDuration(get("FLUSH")); err == nil {
		opts = append(opts, cdc.WithFlushInterval(d))
	}
	if d, err := time.ParseDuration(get("RECONCILE")); err == nil {
		opts = append(opts, cdc.WithReconcileInterval(d))
	}
	opts = append(opts, cdc.WithFaults(faultsFrom(get("FAULTS"))))
	r, err := cdc.New(get("URL"), p, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := r.Run(context.Background()); err != nil { // until SIGKILLed
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func (h *harness) startChild(t *testing.T, k *kafkaSink, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	env := os.Environ()
	for _, kv := range extraEnv {
		env = append(env, childEnv+"_"+kv)
	}
	cmd.Env = append(env,
		childEnv+"=1",
		childEnv+"_URL="+h.s.URL,
		childEnv+"_SCHEMA="+h.s.Schema,
		childEnv+"_SLOT="+h.slot,
		childEnv+"_PUB="+h.pub,
		childEnv+"_SEEDS="+strings.Join(k.seeds, ","),
	)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// SIGKILL the relay process at random moments while events are committed,
// repeatedly: no event is lost, per-aggregate order holds at the broker,
// and duplicates come only from the unacknowledged tail — an event whose
// transaction was confirmed to Postgres before a kill is never published
// again by a later relay.
func TestSIGKILLMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	ctx := context.Background()
	h := newHarness(t)
	k := startKafka(t)

	// Producer: commits events continuously; after each commit it notes an
	// upper bound of the transaction's end LSN.
	type produced struct {
		events []ferry.Event
		after  pglogrepl.LSN
	}
	var mu sync.Mutex
	var log []produced
	stopProd := make(chan struct{})
	prodDone := make(chan struct{})
	conn, err := h.s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	go func() {
		defer close(prodDone)
		for i := 0; ; i++ {
			select {
			case <-stopProd:
				return
			default:
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			n := 1 + i%3
			evs := make([]ferry.Event, n)
			for j := range evs {
				evs[j] = event(fmt.Sprintf("agg-%d", (i+j)%7))
			}
			evs, err = h.w.InsertTx(ctx, tx, evs...)
			if err != nil {
				t.Error(err)
				_ = tx.Rollback(ctx)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
				return
			}
			var after pglogrepl.LSN
			if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&after); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			log = append(log, produced{evs, after})
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		}
	}()

	type kill struct {
		confirmed pglogrepl.LSN
		hw        int // broker records before the next relay started
	}
	var kills []kill
	const rounds = 6
	for round := range rounds {
		cmd := h.startChild(t, k)
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		c := h.confirmed(ctx)
		// The high-water mark: the broker's records once every event the
		// slot confirmed (commit <= after <= c: acked before the kill) is
		// among them. A fixed one-second read under-counted under load and
		// made events published before the kill look republished after it.
		confirmedIDs := map[string]bool{}
		mu.Lock()
		for _, p := range log {
			if p.after != 0 && p.after <= c {
				for _, e := range p.events {
					confirmedIDs[e.ID.String()] = true
				}
			}
		}
		mu.Unlock()
		hw := len(k.read(10*time.Second, func(rs []record) bool {
			seen := map[string]bool{}
			for _, r := range rs {
				if confirmedIDs[r.id] {
					seen[r.id] = true
				}
			}
			return len(seen) == len(confirmedIDs)
		}))
		kills = append(kills, kill{c, hw})
		t.Logf("round %d: killed; slot confirmed %s, broker holds %d records", round, c, hw)
	}
	close(stopProd)
	<-prodDone

	// A final relay (in-process) drains the rest.
	_, stop := h.start(k.publisher())
	defer stop()
	mu.Lock()
	var all []ferry.Event
	after := map[string]pglogrepl.LSN{}
	for _, p := range log {
		all = append(all, p.events...)
		for _, e := range p.events {
			after[e.ID.String()] = p.after
		}
	}
	mu.Unlock()
	got := k.read(60*time.Second, allDelivered(all))
	v := judge(all, got)
	t.Logf("%d events committed, %d records at the broker, %d duplicates", len(all), len(got), v.duplicates)
	if v.lost != 0 || v.phantom != 0 || v.orderViolations != 0 {
		t.Fatalf("violations: lost=%d phantom=%d order=%d", v.lost, v.phantom, v.orderViolations)
	}
	if len(all) < 100 {
		t.Fatalf("only %d events committed: the test did not exercise the relay", len(all))
	}
	// Rows committed before the slot existed are caught up from the table
	// (ids up to catchup_upto): the slot's confirmed position says nothing
	// about them, their mark in the table does, and a kill mid catch-up
	// republishes the ones not yet marked.
	//
	// A relay killed between creating the slot and recording that bound
	// leaves it NULL, and the next relays catch up unbounded: every row
	// committed before the slot's consistent point is then catch-up
	// material. The slot cannot advance before a catch-up completes, so
	// the first kill that found the slot saw exactly that point (a clean-
	// clone CI met this window: round 0 created the slot and was killed
	// before writing the bound).
	var upto *int64
	if err := h.s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT max(catchup_upto) FROM %s`, h.tables.Name("cdc_slot"))).Scan(&upto); err != nil {
		t.Fatal(err)
	}
	var slotStart pglogrepl.LSN // set only when the bound is NULL
	if upto == nil {
		for _, kl := range kills {
			if kl.confirmed != 0 {
				slotStart = kl.confirmed
				break
			}
		}
		t.Logf("the slot's creator was killed before recording its catch-up bound: rows committed before %s were caught up unbounded", slotStart)
	}
	caughtUp := map[string]bool{}
	rows, err := h.s.Pool.Query(ctx, fmt.Sprintf(`SELECT o.event_id::text FROM %s o WHERE o.id <= $1`, h.tables.Name("outbox")), upto)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		caughtUp[id] = true
	}
	rows.Close()
	// Duplicates only from the unacknowledged tail.
	for i, kl := range kills {
		seen := map[string]bool{}
		for _, r := range got[:min(kl.hw, len(got))] {
			seen[r.id] = true
		}
		for _, r := range got[min(kl.hw, len(got)):] {
			if seen[r.id] && !caughtUp[r.id] && after[r.id] > slotStart && after[r.id] <= kl.confirmed {
				t.Errorf("kill %d: event %s was confirmed to Postgres (commit <= %s <= %s) yet published again after restart",
					i, r.id, after[r.id], kl.confirmed)
			}
		}
	}
	waitFor(t, 20*time.Second, "every row marked sent", func() bool { return h.statusCounts(ctx)["sent"] == len(all) })
}

// A relay that dies between creating the slot and recording its catch-up
// bound (the snapshot's highest outbox id) leaves the marker set with no
// bound. The next relay must catch up every pending row unbounded: rows
// committed before the slot existed are in no stream. The state is set up
// exactly as that crash leaves it (the record written first, then the
// slot); the negative control skips the catch-up and loses those rows.
func TestCreatorKilledBeforeCatchUpBound(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*harness, *kafkaSink, []ferry.Event, []ferry.Event) {
		h := newHarness(t)
		k := startKafka(t)
		before := h.insert(ctx, 20, 4)
		if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %q FOR TABLE %s WITH (publish = 'insert')`,
			h.pub, h.tables.Name("outbox"))); err != nil {
			t.Fatal(err)
		}
		if _, err := h.s.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot_name, publication, catchup_needed) VALUES ($1, $2, true)`,
			h.tables.Name("cdc_slot")), h.slot, h.pub); err != nil {
			t.Fatal(err)
		}
		if _, err := h.s.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, h.slot); err != nil {
			t.Fatal(err)
		}
		return h, k, before, h.insert(ctx, 20, 4)
	}

	t.Run("unbounded catch-up", func(t *testing.T) {
		h, k, before, after := setup(t)
		_, stop := h.start(k.publisher())
		defer stop()
		all := append(before, after...)
		v := judge(all, k.read(30*time.Second, allDelivered(all)))
		if v.lost != 0 || v.phantom != 0 || v.orderViolations != 0 {
			t.Fatalf("violations: %+v", v)
		}
		waitFor(t, 30*time.Second, "every row marked sent", func() bool { return h.statusCounts(ctx)["sent"] == len(all) })
		var needed bool
		if err := h.s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT catchup_needed FROM %s WHERE slot_name = $1`, h.tables.Name("cdc_slot")),
			h.slot).Scan(&needed); err != nil || needed {
			t.Fatalf("catch-up marker after the catch-up: needed=%v err=%v, want cleared", needed, err)
		}
	})

	t.Run("negative control: no catch-up loses the rows before the slot", func(t *testing.T) {
		h, k, before, after := setup(t)
		_, stop := h.start(k.publisher(), cdc.WithFaults(cdc.Faults{NoCatchUp: true, NoReconcile: true}))
		defer stop()
		got := k.read(30*time.Second, allDelivered(after))
		if v := judge(append(before, after...), got); v.lost != len(before) {
			t.Fatalf("without the catch-up lost=%d (%+v), want the %d rows committed before the slot", v.lost, v, len(before))
		}
	})
}
