package relay

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/ferryhq/ferry/driver/mysql"
)

// TestStartRetriesContention: when MySQL/MariaDB gives up one of the
// start's writes to rows every starting relay writes (a lock wait timeout
// here; a deadlock when relays start together, as the project's CI once
// saw), the start retries it instead of failing. The relay's sessions give
// up a lock wait after 1 s (a session variable in the URL: the shared
// server is untouched) while a transaction holds a row the start writes
// uncommitted for 2.5 s, so at least one try must fail and be retried:
// shard 0's lease row (the upsert of the lease rows), or the relay's own
// instance row (the first lease tick's heartbeat). Without the retry Run
// returns "driver: lock wait timeout" and the test fails.
func TestStartRetriesContention(t *testing.T) {
	for name, hold := range map[string]string{
		"lease_rows": "INSERT INTO ferry_relay_leases (shard) VALUES (0)",
		"heartbeat":  "INSERT INTO ferry_relay_instances (instance_id, shard_count, expires_at) VALUES ('relay-held', 4, NOW(6))",
	} {
		t.Run(name, func(t *testing.T) { testStartRetriesContention(t, hold) })
	}
}

func testStartRetriesContention(t *testing.T, holdSQL string) {
	s := newMySQLStore(t, 4)
	ctx := context.Background()
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("innodb_lock_wait_timeout", "1")
	u.RawQuery = q.Encode()
	db, err := mysql.Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })

	tx, err := s.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, holdSQL); err != nil {
		t.Fatal(err)
	}
	const hold = 2500 * time.Millisecond
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(hold)
		if err := tx.Commit(); err != nil {
			t.Errorf("commit the holder: %v", err)
		}
		released <- time.Now()
	}()

	n := startEmbeddedNATS(t)
	r, err := New(mysql.New(db), n.publisher(t), append(fastOpts(4), WithInstanceID("relay-held"))...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	deadline := time.After(30 * time.Second)
	for len(r.Status().OwnedShards) != 4 {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v while a row it writes was held, want it to retry", err)
		case <-deadline:
			t.Fatalf("relay owns %v after 30 s, want 4 shards", r.Status().OwnedShards)
		case <-time.After(20 * time.Millisecond):
		}
	}
	owned := time.Now()
	at := <-released
	if owned.Before(at) {
		t.Fatalf("relay owned its shards %v before the holder committed: the upsert did not wait on the held row", at.Sub(owned))
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after stop = %v", err)
	}
}
