package relay

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/ferryhq/ferry/driver/mysql"
)

// TestStartRetriesLeaseUpsert: when MySQL/MariaDB gives up the start's
// upsert of the lease rows (a lock wait timeout here; a deadlock when
// relays start together, as the project's CI once saw), the start retries
// it instead of failing. The relay's sessions give up a lock wait after 1 s
// (a session variable in the URL: the shared server is untouched) while a
// transaction holds shard 0's row uncommitted for 2.5 s, so at least one
// try must fail and be retried. Without the retry Run returns "create
// lease rows: driver: lock wait timeout" and the test fails.
func TestStartRetriesLeaseUpsert(t *testing.T) {
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
	if _, err := tx.ExecContext(ctx, "INSERT INTO ferry_relay_leases (shard) VALUES (0)"); err != nil {
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
	r, err := New(mysql.New(db), n.publisher(t), fastOpts(4)...)
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
			t.Fatalf("Run returned %v while the lease row was held, want it to retry the upsert", err)
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
