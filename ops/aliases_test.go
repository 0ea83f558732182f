package ops_test

import (
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/ops"
)

type ops_Parked = ops.ParkedMessage

var (
	ops_ErrNotFound          = ops.ErrNotFound
	ops_ErrRetentionTooShort = ops.ErrRetentionTooShort
)

func ops_filter(id uuid.UUID) ops.Filter { return ops.Filter{EventIDs: []string{id.String()}} }

func ops_parkedFilter(consumer, reason string) ops.ParkedFilter {
	return ops.ParkedFilter{Consumer: consumer, Reason: reason}
}

func ops_approval(reason string) ops.Approval {
	return ops.Approval{Approve: true, Actor: "alice", Reason: reason}
}

func ops_cleanup(retention time.Duration, batch int) ops.CleanupOptions {
	return ops.CleanupOptions{Retention: retention, BatchSize: batch}
}
