package ops_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// Example shows the operator loop on an embedded SQLite store: look at the
// backlog, preview a dead-letter retry, approve it (audited), and see the
// cleanup guard refuse a retention inside the replay window.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-ops-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		fmt.Println(err)
		return
	}
	w, _ := outbox.New(drv)
	evs, _ := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "42",
		EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)})
	// (The relay gave up on it.)
	_, _ = drv.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'dead', attempts = 10`)

	o, _ := ops.New(drv)
	st, _ := o.Status(ctx)
	fmt.Printf("pending %d, dead %d\n", st.Outbox.Pending, st.Outbox.Dead)

	f := ops.Filter{EventIDs: []string{evs[0].ID.String()}}
	res, _ := o.RetryDead(ctx, f, ops.Approval{})
	fmt.Printf("dry run: %d row would change\n", res.Rows)

	res, _ = o.RetryDead(ctx, f, ops.Approval{Approve: true, Actor: "alice", Reason: "broker ACL fixed"})
	fmt.Printf("retried %d row, audit #%d\n", res.Rows, res.AuditID)

	_, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: 24 * time.Hour}, ops.Approval{Approve: true, Actor: "cron", Reason: "nightly"})
	fmt.Println(errors.Is(err, ops.ErrRetentionTooShort))
	// Output:
	// pending 0, dead 1
	// dry run: 1 row would change
	// retried 1 row, audit #1
	// true
}
