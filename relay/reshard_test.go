package relay

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// TestReshardCountsOnlyPublishableRows: the shard-count check at start
// counts only rows a relay could still publish under the old N. Dead
// letters discarded with `ferry dlq discard` (ops.DiscardDead) no longer
// block a relay with a new N; pending rows and dead letters that are not
// discarded still do, and the error says which rows and which commands.
func TestReshardCountsOnlyPublishableRows(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) *store{
		"postgres": func(t *testing.T) *store { return newPGStore(t, 16) },
		"mysql":    func(t *testing.T) *store { return newMySQLStore(t, 16) },
		"sqlite":   func(t *testing.T) *store { return newSQLiteStore(t, 16) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)
			n := startEmbeddedNATS(t)
			o, err := ops.New(s.db, ops.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			start := func() error {
				t.Helper()
				r, err := s.newRelay(n.publisher(t), fastOpts(8)...)
				if err != nil {
					t.Fatal(err)
				}
				return r.Run(ctx)
			}

			// 5 dead letters written with 16, not discarded: they could be
			// retried, so they block, and the error says how to resolve them.
			s.produce(t, 5, 5)
			if _, err := s.db.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'dead', attempts = 5, last_error = 'rejected'`); err != nil {
				t.Fatal(err)
			}
			err = start()
			var sce *ShardCountError
			if !errors.As(err, &sce) || sce.Configured != 8 || sce.Found != 16 || sce.Rows != 5 || sce.Pending != 0 || sce.Dead != 5 {
				t.Fatalf("Run with 5 dead letters of another N = %v (%+v)", err, sce)
			}
			want := "relay: shard count mismatch: this relay is configured with 8 shards but 5 outbox rows a relay can still publish were written with 16 " +
				"(0 pending, 5 dead letters not discarded); before changing the shard count resolve the 5 dead letters (`ferry dlq list`): " +
				"`ferry dlq discard --approve --reason \"…\"` them, or `ferry dlq retry --approve --reason \"…\"` them while a relay with --shards 16 runs; " +
				"sent rows and discarded dead letters do not count"
			if err.Error() != want {
				t.Fatalf("error\n got %s\nwant %s", err, want)
			}

			// Discarded: nothing a relay could publish is left; a relay with
			// the new count starts and owns every shard.
			res, err := o.DiscardDead(ctx, ops.Filter{All: true}, ops.Approval{Approve: true, Actor: "alice", Reason: "resharding to 8"})
			if err != nil || res.Rows != 5 {
				t.Fatalf("discard: %+v %v", res, err)
			}
			if dead, err := o.ListDead(ctx, ops.Filter{All: true}, false); err != nil || len(dead) != 0 {
				t.Fatalf("dlq list after discard: %d rows, %v", len(dead), err)
			}
			r, err := s.newRelay(n.publisher(t), fastOpts(8)...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, r)
			waitFor(t, 20*time.Second, "relay with 8 shards running", func() bool { return len(r.Status().OwnedShards) == 8 })
			// Owning shards means the check passed (it runs before any lease
			// is taken); a stop that lands inside start's last query may
			// return context.Canceled, which is not what is tested here.
			if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("relay with 8 shards: %v", err)
			}

			// Pending rows written with the old count still refuse, with the
			// exact guidance; a dead letter beside them is named too.
			s.produce(t, 4, 4)
			if _, err := s.db.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'dead' WHERE id = (SELECT max(id) FROM ferry_outbox)`); err != nil {
				t.Fatal(err)
			}
			err = start()
			if !errors.As(err, &sce) || sce.Found != 16 || sce.Pending != 3 || sce.Dead != 1 || sce.Rows != 4 {
				t.Fatalf("Run with 3 pending rows and 1 dead letter of another N = %v (%+v)", err, sce)
			}
			want = "relay: shard count mismatch: this relay is configured with 8 shards but 4 outbox rows a relay can still publish were written with 16 " +
				"(3 pending, 1 dead letters not discarded); before changing the shard count run the relay with the old count " +
				"(`ferry relay --shards 16`, writers still on 16) until the 3 pending rows are sent (`ferry status` shows pending 0), " +
				"and resolve the 1 dead letters (`ferry dlq list`): `ferry dlq discard --approve --reason \"…\"` them, or " +
				"`ferry dlq retry --approve --reason \"…\"` them while a relay with --shards 16 runs; sent rows and discarded dead letters do not count"
			if err.Error() != want {
				t.Fatalf("error\n got %s\nwant %s", err, want)
			}
		})
	}
}
