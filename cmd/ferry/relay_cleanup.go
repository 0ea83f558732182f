package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/ops"
)

// startScheduledCleanup runs ops.RunCleanup beside the relay when
// --cleanup-interval is set. The retention guard is checked before the relay
// starts, so a retention shorter than the replay window refuses to start
// instead of failing later in the background. The returned func stops it.
func startScheduledCleanup(ctx context.Context, f *relayFlags, st *store, log *slog.Logger) (func(), error) {
	if f.cleanupEvery <= 0 {
		if f.cleanupArchive != "" {
			return nil, fmt.Errorf("--cleanup-archive: needs --cleanup-interval > 0 (it archives the scheduled cleanup's batches)")
		}
		return func() {}, nil
	}
	o, err := ops.New(st, ops.WithTables(st.tables), ops.WithLogger(log))
	if err != nil {
		return nil, err
	}
	opts := ops.CleanupOptions{Retention: f.cleanupRetention}
	// Open (and so validate) the archive before the relay starts: a bad
	// URL refuses to start instead of failing every tick in the background.
	// ops.Cleanup deletes only the batches the archive confirmed.
	closeArchive := func() {}
	if f.cleanupArchive != "" {
		as, err := openArchive(ctx, "--cleanup-archive", f.cleanupArchive)
		if err != nil {
			return nil, err
		}
		opts.Archive = as
		closeArchive = func() { _ = as.Close() }
	}
	started := false
	defer func() {
		if !started {
			closeArchive()
		}
	}()
	w, err := o.ReplayWindow(ctx)
	if err != nil {
		return nil, err
	}
	if err := ops.CheckRetention(opts, w); err != nil {
		return nil, fmt.Errorf("--cleanup-retention: %w", err)
	}
	host, _ := os.Hostname()
	approval := ops.Approval{Approve: true, Actor: "relay/" + host, Reason: "scheduled cleanup (ferry relay --cleanup-interval)"}
	started = true
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := o.RunCleanup(cctx, f.cleanupEvery, opts, approval); err != nil && !errors.Is(err, context.Canceled) {
			log.ErrorContext(ctx, "scheduled cleanup stopped", logattr.Err(err))
		}
	}()
	log.InfoContext(ctx, "scheduled cleanup", "every", f.cleanupEvery.String(), "retention", f.cleanupRetention.String(), "archive", opts.Archive != nil)
	return func() { cancel(); wg.Wait(); closeArchive() }, nil
}
