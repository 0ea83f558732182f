package partition

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Keeper keeps a partitioned outbox's partitions created DefaultAhead
// intervals ahead of now, for whatever process publishes from it (the
// polling relay and the CDC relay): producers must never find no
// partition while a relay runs.
type Keeper struct {
	Exec   driver.Executor
	Tables ferry.Tables
	Log    *slog.Logger
}

// Ensure creates the partitions the next DefaultAhead intervals need and
// logs the ones it made.
func (k Keeper) Ensure(ctx context.Context) error {
	created, err := Ensure(ctx, k.Exec, k.Tables, time.Now(), 0, DefaultAhead)
	if err != nil {
		return fmt.Errorf("create outbox partitions ahead: %w", err)
	}
	if len(created) > 0 {
		k.Log.InfoContext(ctx, "outbox partitions created ahead", "partitions", created)
	}
	return nil
}

// Start is Ensure before the first publish. A process that cannot create
// partitions (a role without CREATE on the schema) still starts while the
// partitions made earlier cover now: it logs the failure and Maintain
// retries every tick. Start fails only when no partition covers now.
func (k Keeper) Start(ctx context.Context) error {
	err := k.Ensure(ctx)
	if err == nil {
		return nil
	}
	parts, lerr := List(ctx, k.Exec, k.Tables)
	if lerr != nil || len(parts) == 0 || !parts[len(parts)-1].To.After(time.Now()) {
		return err
	}
	k.Log.WarnContext(ctx, "outbox partitions not created ahead; the existing ones last until "+parts[len(parts)-1].To.Format(time.RFC3339), logattr.Err(err))
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
			k.Log.WarnContext(ctx, "outbox partition maintenance failed; retried at the next tick", logattr.Err(err))
		}
	}
}
