package ops

import (
	"context"
	"errors"
)

// ActionClaimCheckSweep is the audit action of SweepClaimChecks.
const ActionClaimCheckSweep = "claimcheck.sweep"

// ClaimCheckSweepFunc runs one sweep of claim-check blobs (wrap
// claimcheck.Store.Sweep): exists says whether an outbox row holds an
// event id; with dryRun it only counts. A func, not the store, so ops does
// not link the blob library.
type ClaimCheckSweepFunc func(ctx context.Context, exists func(ctx context.Context, eventID string) (bool, error), dryRun bool) (orphans, deleted int, err error)

// ClaimCheckSweep is what SweepClaimChecks did (dry run: would delete).
type ClaimCheckSweep struct {
	Action  string `json:"action"`
	DryRun  bool   `json:"dry_run"`
	Orphans int    `json:"orphans"`
	Deleted int    `json:"deleted"`
	AuditID int64  `json:"audit_id,omitempty"`
}

// SweepClaimChecks removes the claim-check blobs no outbox row references,
// with this store's outbox as the reference. Without a.Approve it only
// counts; with it, it deletes and writes one audit row (filter: what the
// caller passes, e.g. the grace period and retention, plus the orphans).
func (o *Ops) SweepClaimChecks(ctx context.Context, sweep ClaimCheckSweepFunc, filter map[string]any, a Approval) (ClaimCheckSweep, error) {
	res := ClaimCheckSweep{Action: ActionClaimCheckSweep, DryRun: !a.Approve}
	if err := a.check(); err != nil {
		return res, err
	}
	if sweep == nil {
		return res, &ArgError{Field: "sweep", Reason: "required"}
	}
	exists := func(ctx context.Context, id string) (bool, error) {
		_, err := o.Message(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	var err error
	res.Orphans, res.Deleted, err = sweep(ctx, exists, !a.Approve)
	if err != nil || !a.Approve {
		return res, err
	}
	f := map[string]any{"orphans": res.Orphans}
	for k, v := range filter {
		f[k] = v
	}
	res.AuditID, err = o.writeAudit(ctx, o.db.Executor(), ActionClaimCheckSweep, a, f, nil, int64(res.Deleted))
	return res, err
}
