package inbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// partitionOf names the inbox partition holding the claim of id.
func (s *natsStack) partitionOf(t testing.TB, id uuid.UUID) string {
	t.Helper()
	var name string
	if err := s.drv.Pool().QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM ferry_inbox WHERE event_id = $1`, id).Scan(&name); err != nil {
		t.Fatalf("claim of %s: %v", id, err)
	}
	return name
}

// TestPartitionedInboxDedup (G4 on an inbox partitioned by event_id): an
// event whose transaction committed but whose ack never reached JetStream
// (the consumer killed in between) is redelivered by the broker and
// absorbed — one effect — for a UUIDv7 id of now (its claim in the range
// partition of today), a UUIDv4 id and a UUIDv7 of 2001 (both outside the
// ranges: their claims in the default partition, deduplicated there too).
func TestPartitionedInboxDedup(t *testing.T) {
	s := newNATSStackMigrated(t, "", []migrate.Option{migrate.WithPartitionedInbox(24 * time.Hour)})
	old, err := partition.UUIDv7At(time.Date(2001, 9, 9, 1, 46, 40, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	today := partition.Name(ferry.Tables{}, partition.Inbox, time.Now().UTC().Truncate(24*time.Hour))
	cases := []struct {
		name string
		id   uuid.UUID
		part string
	}{
		{"uuidv7-now", uuid.Must(uuid.NewV7()), today},
		{"uuidv4", uuid.New(), "ferry_inbox_default"},
		{"uuidv7-2001", old, "ferry_inbox_default"},
	}
	for i, c := range cases {
		ev := event(t, "acme", fmt.Sprintf("o%d", i), 1, `{"n":1}`)
		ev.ID = c.id
		s.publish(t, ev)
		crash := errors.New("kill -9")
		faulty := s.inbox(t, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
		cons, kill := s.crashConsumer(t)
		if err := faulty.Run(context.Background(), cons); !errors.Is(err, ErrFault) {
			t.Fatalf("%s: Run with fault: %v", c.name, err)
		}
		kill()
		restarted := s.inbox(t)
		s.runUntil(t, restarted, func() bool { return restarted.Stats().Duplicates == 1 })
		if got := s.effectSeqs(t, ev.ID.String()); len(got) != 1 {
			t.Fatalf("%s: effects %v, want exactly 1", c.name, got)
		}
		if st := restarted.Stats(); st.Applied != 0 {
			t.Fatalf("%s: the redelivery was applied again: %+v", c.name, st)
		}
		if got := s.partitionOf(t, ev.ID); got != c.part {
			t.Fatalf("%s: claim in %s, want %s", c.name, got, c.part)
		}
		t.Logf("%s: one effect, redelivery absorbed, claim in %s", c.name, c.part)
	}
}

// TestPartitionedInboxKeeper: Run creates a partitioned inbox's ranges
// ahead (the keeper), and does nothing of the kind on a plain inbox. A
// range whose rows already sit in the default partition (a claim of an id
// from a clock ahead, made before its range existed) is skipped and the
// ranges after it are made; that event's redelivery is still absorbed in
// the default partition.
func TestPartitionedInboxKeeper(t *testing.T) {
	ctx := context.Background()
	s := newNATSStackMigrated(t, "", []migrate.Option{migrate.WithPartitionedInbox(time.Second)})
	exec := s.drv.Executor()
	before, err := partition.List(ctx, exec, ferry.Tables{}, partition.Inbox)
	if err != nil || len(before) < partition.DefaultAhead+1 {
		t.Fatalf("after migrate: %d partitions, %v", len(before), err)
	}
	last := before[len(before)-1].To
	ahead := event(t, "acme", "ahead", 1, `{"n":1}`)
	blocked := last.Add(3 * time.Second)
	if ahead.ID, err = partition.UUIDv7At(blocked.Add(500 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The claim is made through the inbox's core while no keeper runs, so
	// it is made before its range exists. (Run starts its keeper at once:
	// on a loaded CI machine the keeper made the range before Run's first
	// delivery claimed the event, "the early claim is in
	// ferry_inbox_p20261206_103251".)
	first := s.inbox(t)
	if err := first.process(ctx, []*message{newMessage(delivery(ahead, 1, &settled{}))}); err != nil {
		t.Fatal(err)
	}
	if st := first.Stats(); st.Applied != 1 {
		t.Fatalf("the early event: %+v, want applied", st)
	}
	if got := s.partitionOf(t, ahead.ID); got != "ferry_inbox_default" {
		t.Fatalf("the early claim is in %s", got)
	}
	ib := s.inbox(t, WithPartitionMaintenance(100*time.Millisecond))
	s.runUntil(t, ib, func() bool {
		parts, err := partition.List(ctx, exec, ferry.Tables{}, partition.Inbox)
		return err == nil && parts[len(parts)-1].To.After(blocked.Add(2*time.Second))
	})
	if got := s.partitionOf(t, ahead.ID); got != "ferry_inbox_default" {
		t.Fatalf("after the keeper: the early claim is in %s", got)
	}
	parts, err := partition.List(ctx, exec, ferry.Tables{}, partition.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if p.From.Equal(blocked) {
			t.Fatalf("range %s was created over a row of the default partition", p.Name)
		}
	}
	// A redelivery of that event, through the inbox's core, is absorbed
	// by its claim in the default partition.
	again := s.inbox(t)
	rec := &settled{}
	if err := again.process(ctx, []*message{newMessage(delivery(ahead, 1, rec))}); err != nil {
		t.Fatal(err)
	}
	if st := again.Stats(); st.Duplicates != 1 || len(s.effectSeqs(t, ahead.ID.String())) != 1 {
		t.Fatalf("redelivery of the early event: %+v, effects %v", st, s.effectSeqs(t, ahead.ID.String()))
	}

	plain := newNATSStack(t, "")
	pib := plain.inbox(t)
	if _, ok := pib.partitionKeeper(ctx); ok {
		t.Fatal("a keeper on a plain inbox")
	}
}

// TestPartitionedInboxAcrossBoundaries: a consumer runs while its inbox
// rolls over one-second partitions for 11 s (migrate made 8 of them); events are published with
// UUIDv7 ids of their moment, a tenth of them published again after the
// broker's duplicate window (a redelivery the broker does not absorb).
// Every event is applied exactly once, none is lost, their claims spread
// over the range partitions (none in the default), and the ranges past
// the ones migrate made were made by the consumer's keeper.
func TestPartitionedInboxAcrossBoundaries(t *testing.T) {
	ctx := context.Background()
	s := newNATSStackMigrated(t, "", []migrate.Option{migrate.WithPartitionedInbox(time.Second)})
	// A stream with a short duplicate window, so a republished event is
	// delivered again.
	if err := s.pub.JetStream().DeleteStream(ctx, s.stream); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, s.pub.JetStream(), natsjs.StreamConfig{Name: s.stream, Subjects: []string{s.subject}, DuplicateWindow: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	migrated, err := partition.List(ctx, s.drv.Executor(), ferry.Tables{}, partition.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]bool{}
	for _, p := range migrated {
		made[p.Name] = true
	}
	ib := s.inbox(t, WithPartitionMaintenance(200*time.Millisecond), WithWorkers(4))
	c := s.consumer(t)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ib.Run(rctx, c) }()

	const aggregates = 16
	seq := map[string]int64{}
	var sent []ferry.Event
	var again []ferry.Event
	end := time.Now().Add(11 * time.Second)
	for i := 0; time.Now().Before(end); i++ {
		agg := fmt.Sprintf("o%d", i%aggregates)
		seq[agg]++
		ev := event(t, "acme", agg, seq[agg], fmt.Sprintf(`{"n":%d}`, i))
		s.publish(t, ev)
		sent = append(sent, ev)
		if i%10 == 5 {
			again = append(again, ev)
		}
		if len(again) > 0 && i%10 == 9 {
			time.Sleep(120 * time.Millisecond) // past the duplicate window
			s.publish(t, again...)
			again = again[:0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	dups := 0
	for i := range sent {
		if i%10 == 5 && i+4 < len(sent) {
			dups++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := ib.Stats(); st.Applied < int64(len(sent)) || st.Duplicates < int64(dups); st = ib.Stats() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("not drained: %+v, want %d applied, %d duplicates", st, len(sent), dups)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := ib.Stats()
	if st.Applied != int64(len(sent)) {
		t.Fatalf("applied %d, want %d", st.Applied, len(sent))
	}
	var effects, distinct, inDefault, partsUsed, byKeeper int
	pool := s.drv.Pool()
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM effects`).Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	if effects != len(sent) || distinct != len(sent) {
		t.Fatalf("%d effects of %d events, %d published: lost or applied twice", effects, distinct, len(sent))
	}
	rows, err := pool.Query(ctx, `SELECT tableoid::regclass::text, count(*) FROM ferry_inbox GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		switch {
		case name == "ferry_inbox_default":
			inDefault += n
		default:
			partsUsed++
			if !made[name] {
				byKeeper += n
			}
		}
	}
	rows.Close()
	if inDefault != 0 || partsUsed < 8 || byKeeper == 0 {
		t.Fatalf("claims: %d in the default partition, %d range partitions used, %d in partitions the keeper made", inDefault, partsUsed, byKeeper)
	}
	t.Logf("%d events (%d redelivered and absorbed) over %d one-second partitions, %d claims in partitions the consumer's keeper made; 0 lost, 0 applied twice",
		len(sent), st.Duplicates, partsUsed, byKeeper)
}

// rangePartition matches the inbox's range partitions' names.
var rangePartition = regexp.MustCompile(`^ferry_inbox_p[0-9]{8}_[0-9]{6}$`)

// TestPartitionedInboxClaimPlan: the live claim's dedup lookup by
// (consumer, tenant_id, event_id) reads one partition — the one its id's
// time falls in, or the default for a UUIDv4 — through that partition's
// primary key; the batch pass's lookup (ids in an array) probes only the
// partitions its ids fall in (run-time pruning: the others are never
// executed). Control: a read by (consumer, tenant_id) alone visits every
// partition.
func TestPartitionedInboxClaimPlan(t *testing.T) {
	ctx := context.Background()
	s := newNATSStackMigrated(t, "", []migrate.Option{migrate.WithPartitionedInbox(24 * time.Hour)})
	pool := s.drv.Pool()
	day := time.Now().UTC().Truncate(24 * time.Hour)
	for d := 1; d <= 6; d++ {
		if _, err := partition.Create(ctx, s.drv.Executor(), ferry.Tables{}, partition.Inbox, day.Add(-time.Duration(d)*24*time.Hour), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// 2,000 claims a day over the last week and today, 1,000 with v4 ids.
	if _, err := pool.Exec(ctx, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
SELECT 'shipping', 'acme',
    (lpad(to_hex((extract(epoch FROM $1::timestamptz) * 1000)::bigint - (g % 7) * 86400000 + g), 12, '0') || '7' || substr(md5(g::text), 1, 19))::uuid,
    '\x00', 'order', 'o' || g, 1, 'order.created', now()
FROM generate_series(1, 14000) g`, day.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
SELECT 'shipping', 'acme', gen_random_uuid(), '\x00', 'order', 'v' || g, 1, 'order.created', now() FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE ferry_inbox`); err != nil {
		t.Fatal(err)
	}
	var v7, v4 uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT event_id FROM ferry_inbox WHERE tableoid = $1::regclass LIMIT 1`,
		partition.Name(ferry.Tables{}, partition.Inbox, day.Add(-3*24*time.Hour))).Scan(&v7); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT event_id FROM ferry_inbox_default LIMIT 1`).Scan(&v4); err != nil {
		t.Fatal(err)
	}
	q, err := newQueries("postgres", ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	explain := func(analyze bool, sql string, args ...any) (scans map[string]string, executed map[string]bool) {
		t.Helper()
		opts := "FORMAT JSON"
		if analyze {
			opts = "ANALYZE, BUFFERS, FORMAT JSON"
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }() // EXPLAIN ANALYZE runs the statement
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN ("+opts+") "+sql, args...).Scan(&raw); err != nil {
			t.Fatalf("explain: %v", err)
		}
		scans, executed = map[string]string{}, map[string]bool{}
		testenv.WalkPlan(t, raw, func(n map[string]any) {
			rel, _ := n["Relation Name"].(string)
			if !rangePartition.MatchString(rel) && rel != "ferry_inbox_default" {
				return
			}
			scans[rel], _ = n["Node Type"].(string)
			if loops, ok := n["Actual Loops"].(float64); ok && loops > 0 {
				executed[rel] = true
			}
		})
		return scans, executed
	}
	fp := []byte{0}
	for _, c := range []struct {
		name string
		id   uuid.UUID
		want string
	}{{"uuidv7", v7, partition.Name(ferry.Tables{}, partition.Inbox, day.Add(-3*24*time.Hour))}, {"uuidv4", v4, "ferry_inbox_default"}} {
		scans, _ := explain(false, q.claimPG, "shipping", "acme", c.id, "order", "o1", int64(2), fp, true, false, "order.created", time.Now())
		if len(scans) != 1 || scans[c.want] == "" || !strings.HasPrefix(scans[c.want], "Index") {
			t.Fatalf("%s: the claim scans %v, want only %s by index", c.name, scans, c.want)
		}
		t.Logf("%s claim: %v", c.name, scans)
	}
	// The batch pass: two ids, one v7 and one v4.
	_, executed := explain(true, q.bulkRead, "shipping", []string{"acme", "acme"}, []uuid.UUID{v7, v4},
		[]string{"acme"}, []string{"order"}, []string{"o1"}, true)
	if len(executed) != 2 {
		t.Fatalf("the batch lookup of 2 ids executed scans of %v, want 2 partitions", executed)
	}
	// Control: without the event id nothing prunes.
	scans, _ := explain(false, `SELECT count(*) FROM ferry_inbox WHERE consumer = $1 AND tenant_id = $2`, "shipping", "acme")
	parts, err := partition.List(ctx, s.drv.Executor(), ferry.Tables{}, partition.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	if len(scans) != len(parts)+1 {
		t.Fatalf("control: a read without the event id scans %d partitions, want all %d (and the default)", len(scans), len(parts))
	}
	t.Logf("batch lookup executed %v; control scans %d partitions", executed, len(scans))
}
