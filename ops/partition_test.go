package ops_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/relay"
)

// partitionedEnv is a Postgres env whose outbox is partitioned by day, and
// an ops whose clock is 30 days ahead, so every partition made at
// migration time has ended before a 7-day retention's cutoff.
func partitionedEnv(t *testing.T) (*env, *ops.Ops, time.Time) {
	t.Helper()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	if _, err := migrate.Up(context.Background(), drv, tables, migrate.WithPartitionedOutbox(24*time.Hour)); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	e := setup(t, "postgres", drv)
	e.pg = s
	later := time.Now().Add(30 * 24 * time.Hour)
	o, err := ops.New(e.db, ops.WithLogger(slog.New(slog.DiscardHandler)), ops.WithClock(func() time.Time { return later }))
	if err != nil {
		t.Fatal(err)
	}
	return e, o, later
}

// movePartition moves the rows of aggregate agg into the partition of day
// d after today (an update of the partition key moves the row).
func moveToDay(t *testing.T, e *env, agg string, d int) {
	t.Helper()
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(time.Duration(d)*24*time.Hour + time.Hour)
	if n := mustExec(t, e, fmt.Sprintf(`UPDATE %s SET created_at = $1 WHERE aggregate_id = $2`, tn("outbox")), day, agg); n == 0 {
		t.Fatalf("no rows of %s", agg)
	}
}

func partitionOf(t *testing.T, e *env, agg string) string {
	t.Helper()
	var name string
	if _, err := queryOne(e, fmt.Sprintf(`SELECT tableoid::regclass::text FROM %s WHERE aggregate_id = $1 LIMIT 1`, tn("outbox")), []any{agg}, &name); err != nil {
		t.Fatal(err)
	}
	return name
}

func queryOne(e *env, q string, args []any, dest ...any) (bool, error) {
	rows, err := e.exec.Query(context.Background(), q, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	return true, rows.Scan(dest...)
}

// TestPartitionCleanupGuard: cleanup drops a partition only when every row
// in it is sent and was published before the cutoff; a partition holding
// a pending row, a row published inside the retention, or a dead letter
// that was not discarded stays, with the reason. A dry run drops nothing.
// The pending row kept by the guard is then published by a real relay;
// the negative control drops the same partition without the guard, and
// that event never reaches the broker: it is lost.
func TestPartitionCleanupGuard(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		name := "guarded"
		if !guarded {
			name = "negative-control-unguarded"
		}
		t.Run(name, func(t *testing.T) { partitionCleanupGuard(t, guarded) })
	}
}

func partitionCleanupGuard(t *testing.T, guarded bool) {
	ctx := context.Background()
	e, o, later := partitionedEnv(t)
	now := time.Now()
	ids := map[string][]string{}
	var topic string
	for _, agg := range []string{"sent-old", "pending", "sent-late", "dead", "discarded"} {
		for _, ev := range e.insert(t, event(agg, "order.created"), event(agg, "order.paid")) {
			ids[agg] = append(ids[agg], ev.ID.String())
			topic = ev.Topic
		}
	}
	markSent(t, e, now, ids["sent-old"]...)
	markSent(t, e, now, ids["pending"][0]) // the second stays pending
	markSent(t, e, later.Add(-24*time.Hour), ids["sent-late"]...)
	markSent(t, e, now, ids["dead"][0])
	markDead(t, e, ids["dead"][1])
	markSent(t, e, now, ids["discarded"][0])
	markDead(t, e, ids["discarded"][1])
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET discarded_at = $1 WHERE event_id = $2`, tn("outbox")), now, ids["discarded"][1])
	for d, agg := range []string{"sent-old", "pending", "sent-late", "dead", "discarded"} {
		moveToDay(t, e, agg, d)
	}
	parts := map[string]string{}
	for _, agg := range []string{"sent-old", "pending", "sent-late", "dead", "discarded"} {
		parts[agg] = partitionOf(t, e, agg)
	}
	if parts["sent-old"] == parts["pending"] {
		t.Fatalf("rows not spread over partitions: %v", parts)
	}

	if !guarded {
		// The negative control: the same drop without the row checks.
		all, err := partition.List(ctx, e.exec, tables, partition.Outbox)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range all {
			if p.Name == parts["pending"] {
				v, err := partition.Drop(ctx, e.db, tables, partition.Outbox, p, partition.Guard{Cutoff: later.Add(-7 * 24 * time.Hour), Unguarded: true}, false)
				if err != nil || !v.Dropped {
					t.Fatalf("unguarded drop: %+v %v", v, err)
				}
			}
		}
	} else {
		before := snapshot(t, e, "outbox")
		preview, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: 7 * 24 * time.Hour}, ops.Approval{})
		if err != nil {
			t.Fatalf("dry run: %v", err)
		}
		if after := snapshot(t, e, "outbox"); after != before {
			t.Fatal("the dry run changed the outbox")
		}
		res, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: 7 * 24 * time.Hour}, ops.Approval{Approve: true, Actor: "alice", Reason: "partition test"})
		if err != nil {
			t.Fatalf("cleanup: %v", err)
		}
		verdict := map[string]ops.PartitionDrop{}
		for _, v := range res.OutboxPartitions {
			verdict[v.Name] = v
		}
		for _, v := range preview.OutboxPartitions {
			if got := verdict[v.Name]; got.Dropped != v.Dropped || got.Kept != v.Kept {
				t.Errorf("dry run said %s %+v, the run did %+v", v.Name, v, got)
			}
		}
		want := map[string]string{
			"sent-old":  "",
			"pending":   "not sent",
			"sent-late": "published inside",
			"dead":      "not sent",
			"discarded": "not sent",
		}
		for agg, reason := range want {
			v, ok := verdict[parts[agg]]
			if !ok {
				t.Fatalf("no verdict for %s (%s): %+v", agg, parts[agg], res.OutboxPartitions)
			}
			if reason == "" && !v.Dropped {
				t.Errorf("%s: partition %s kept: %s", agg, v.Name, v.Kept)
			}
			if reason != "" && (v.Dropped || !strings.Contains(v.Kept, reason)) {
				t.Errorf("%s: partition %s: dropped=%v kept=%q, want kept for %q", agg, v.Name, v.Dropped, v.Kept, reason)
			}
		}
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE aggregate_id = 'sent-old'`, tn("outbox"))); n != 0 {
			t.Errorf("sent-old rows left: %d", n)
		}
		// In the kept partitions the row cleanup deleted the three rows
		// sent before the cutoff, as on a plain outbox.
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE aggregate_id <> 'sent-old'`, tn("outbox"))); n != 5 {
			t.Errorf("rows of kept partitions: %d, want 5", n)
		}
		// Discarded dead letters go with IncludeDiscarded, once the
		// discard is older than the retention too.
		res, err = o.Cleanup(ctx, ops.CleanupOptions{Retention: 7 * 24 * time.Hour, IncludeDiscarded: true}, ops.Approval{Approve: true, Actor: "alice", Reason: "partition test"})
		if err != nil {
			t.Fatal(err)
		}
		dropped := false
		for _, v := range res.OutboxPartitions {
			dropped = dropped || (v.Name == parts["discarded"] && v.Dropped)
		}
		if !dropped {
			t.Errorf("the discarded dead letter's partition was kept with IncludeDiscarded: %+v", res.OutboxPartitions)
		}
		// A partition detached by a run that died before its drop is
		// dropped by the next run; a table that only looks alike is not.
		all, err := partition.List(ctx, e.exec, tables, partition.Outbox)
		if err != nil {
			t.Fatal(err)
		}
		orphan := all[len(all)-1].Name
		mustExec(t, e, fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %q`, tn("outbox"), orphan))
		mustExec(t, e, fmt.Sprintf(`CREATE TABLE %q (id int)`, tables.Bare("outbox")+"_p_notes"))
		if _, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: 7 * 24 * time.Hour}, ops.Approval{Approve: true, Actor: "alice", Reason: "partition test"}); err != nil {
			t.Fatal(err)
		}
		if n := count(t, e, `SELECT count(*) FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid WHERE relname = $1`, orphan); n != 1 {
			t.Errorf("detached partition %s not dropped and made again as a partition", orphan)
		}
		after, err := partition.List(ctx, e.exec, tables, partition.Outbox)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(after); i++ {
			// Old partitions that were empty were dropped; from the
			// cutoff on, none may be missing.
			if after[i-1].To.After(later.Add(-7*24*time.Hour)) && !after[i].From.Equal(after[i-1].To) {
				t.Errorf("gap in the partitions between %+v and %+v", after[i-1], after[i])
			}
		}
		if n := count(t, e, `SELECT count(*) FROM pg_class WHERE relname = $1`, tables.Bare("outbox")+"_p_notes"); n != 1 {
			t.Errorf("a table not named like a partition was dropped")
		}
		// Cleanup also created partitions ahead of its clock.
		if all, _ := partition.List(ctx, e.exec, tables, partition.Outbox); len(all) == 0 || all[len(all)-1].To.Before(later) {
			t.Errorf("no partitions ahead of %s: %+v", later, all)
		}
	}

	// Both sides: does the pending event reach the broker?
	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	stream, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "PARTTEST", Subjects: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(e.db, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, e, r)
	defer stop()
	pendingID := ids["pending"][1]
	found := false
	deadline := time.Now().Add(10 * time.Second)
	for !found && time.Now().Before(deadline) {
		msg, err := stream.GetLastMsgForSubject(ctx, topic)
		if err == nil && msg.Header.Get("Nats-Msg-Id") == pendingID {
			found = true
			break
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if guarded && !found {
		t.Fatalf("the pending event %s kept by the guard was not published", pendingID)
	}
	if !guarded {
		if found {
			t.Fatal("negative control: the pending event reached the broker although its partition was dropped")
		}
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE event_id = $1`, tn("outbox")), pendingID); n != 0 {
			t.Fatalf("negative control: the row is still there (%d)", n)
		}
		t.Logf("negative control: without the guard the pending event %s is gone from the outbox and never published: lost", pendingID)
	}
}
