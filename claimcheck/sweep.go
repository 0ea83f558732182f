package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/ferryhq/ferry"
)

// RowExists reports whether a committed outbox row holds eventID (any
// status). ops.Ops.Message answers it (ErrNotFound means no row).
type RowExists func(ctx context.Context, eventID string) (bool, error)

// SweepOptions bound what Sweep may delete.
type SweepOptions struct {
	// Grace: a blob younger than this is never deleted — its producer's
	// transaction may still commit. Longer than any producer transaction
	// (and the clock skew between producer and sweeper). At least a
	// minute; 1 h is a safe default.
	Grace time.Duration
	// Retention: a blob older than this is never deleted either — its
	// row may have been cleaned up after being sent (cleanup retention),
	// and an archived copy or a lagging consumer may still need it. Set
	// it to the outbox cleanup retention; blobs beyond it are the bucket's
	// lifecycle rules' to expire. Must exceed Grace.
	Retention time.Duration
	// DryRun counts the orphans without deleting them.
	DryRun bool
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
}

// SweepResult counts what one Sweep saw.
type SweepResult struct {
	Listed     int `json:"listed"`     // blobs under KeyPrefix
	Young      int `json:"young"`      // inside the grace period: kept
	Old        int `json:"old"`        // past the retention: kept
	Referenced int `json:"referenced"` // an outbox row holds the event id: kept
	Orphans    int `json:"orphans"`    // none does: deleted (or, dry run, would be)
	Deleted    int `json:"deleted"`
}

// Sweep deletes orphaned blobs: written by a producer whose transaction
// then rolled back or crashed before commit. A blob is an orphan only when
// its age is between Grace and Retention and no outbox row holds its
// event id (the key is derived from the event id, so no reference table
// is written in the producer's transaction); the row is looked up right
// before the delete. It never deletes a blob a committed row references.
func (s *Store) Sweep(ctx context.Context, exists RowExists, o SweepOptions) (SweepResult, error) {
	var res SweepResult
	if o.Grace < time.Minute {
		return res, &ferry.ConfigError{Field: "claimcheck.sweep.grace", Reason: fmt.Sprintf("must be at least 1m (longer than any producer transaction), got %s", o.Grace)}
	}
	if o.Retention <= o.Grace {
		return res, &ferry.ConfigError{Field: "claimcheck.sweep.retention", Reason: fmt.Sprintf("must exceed the grace period %s, got %s", o.Grace, o.Retention)}
	}
	if exists == nil {
		return res, &ferry.ConfigError{Field: "claimcheck.sweep.exists", Reason: "must not be nil"}
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	it := s.bucket.List(&blob.ListOptions{Prefix: KeyPrefix})
	for {
		obj, err := it.Next(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return res, fmt.Errorf("claimcheck: list %s: %w", s.location, err)
		}
		if obj.IsDir {
			continue
		}
		res.Listed++
		age := now().Sub(obj.ModTime)
		switch {
		case age < o.Grace:
			res.Young++
			continue
		case age >= o.Retention:
			res.Old++
			continue
		}
		id := strings.TrimPrefix(obj.Key, KeyPrefix)
		ok, err := exists(ctx, id)
		if err != nil {
			return res, fmt.Errorf("claimcheck: sweep: look up event %s: %w", id, err)
		}
		if ok {
			res.Referenced++
			continue
		}
		res.Orphans++
		if o.DryRun {
			continue
		}
		if err := s.bucket.Delete(ctx, obj.Key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return res, fmt.Errorf("claimcheck: delete %s: %w", obj.Key, err)
		}
		res.Deleted++
	}
	return res, nil
}
