package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Keeper keeps a partitioned table's partitions created DefaultAhead
// intervals ahead of now, for whatever process writes to it: the polling
// and CDC relays for the outbox (producers must never find no partition
// while a relay runs), the inbox consumer for the inbox (claims of new
// events must go to their range, not pile up in the default partition).
type Keeper struct {
	Exec   driver.Executor
	Tables ferry.Tables
	Table  Table // Outbox or Inbox
	Log    *slog.Logger
}

// Ensure creates the partitions the next DefaultAhead intervals need and
// logs the ones it made. Inbox ranges the default partition already holds
// rows of are logged (with their names) and skipped, not failed: their
// claims stay deduplicated in the default partition.
func (k Keeper) Ensure(ctx context.Context) error {
	created, err := Ensure(ctx, k.Exec, k.Tables, k.Table, time.Now(), 0, DefaultAhead)
	if len(created) > 0 {
		k.Log.InfoContext(ctx, string(k.Table)+" partitions created ahead", "partitions", created)
	}
	if errors.Is(err, ErrDefaultHoldsRange) {
		k.Log.WarnContext(ctx, string(k.Table)+" partitions skipped: the default partition holds rows of their range", logattr.Err(err))
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s partitions ahead: %w", k.Table, err)
	}
	return nil
}

// Start is Ensure before the first write. A process that cannot create
// partitions (a role without CREATE on the schema) still starts while the
// partitions made earlier cover now (or, for the inbox, always: its
// default partition takes any claim): it logs the failure and Maintain
// retries every tick. Start fails only when an outbox has no partition
// covering now.
func (k Keeper) Start(ctx context.Context) error {
	err := k.Ensure(ctx)
	if err == nil {
		return nil
	}
	parts, lerr := List(ctx, k.Exec, k.Tables, k.Table)
	covered := lerr == nil && len(parts) > 0 && parts[len(parts)-1].To.After(time.Now())
	if !covered && k.Table == Outbox {
		return err
	}
	until := "now (new claims go to the default partition)"
	if covered {
		until = parts[len(parts)-1].To.Format(time.RFC3339)
	}
	k.Log.WarnContext(ctx, string(k.Table)+" partitions not created ahead; the existing ones last until "+until, logattr.Err(err))
	return nil
}

// Maintain runs Ensure every interval until ctx ends. A failure is logged
// and retried at the next tick: the partitions made earlier cover
// DefaultAhead intervals, so one failed tick costs nothing.
func (k Keeper) Maintain(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := k.Ensure(ctx); err != nil && ctx.Err() == nil {
			k.Log.WarnContext(ctx, string(k.Table)+" partition maintenance failed; retried at the next tick", logattr.Err(err))
		}
	}
}
