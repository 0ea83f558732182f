package ops

import (
	"context"
	"errors"

	"github.com/ferryhq/ferry/claimcheck"
)

// ActionClaimCheckSweep is the audit action of SweepClaimChecks.
const ActionClaimCheckSweep = "claimcheck.sweep"

// ClaimCheckSweep is what SweepClaimChecks saw (dry run: would delete).
type ClaimCheckSweep struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	claimcheck.SweepResult
	AuditID int64 `json:"audit_id,omitempty"`
}

// SweepClaimChecks removes the claim-check blobs no outbox row references
// (claimcheck.Store.Sweep, with this store's tables as the reference).
// Without a.Approve it only counts; with it, it deletes and writes one
// audit row with the counts.
func (o *Ops) SweepClaimChecks(ctx context.Context, st *claimcheck.Store, opts claimcheck.SweepOptions, a Approval) (ClaimCheckSweep, error) {
	res := ClaimCheckSweep{Action: ActionClaimCheckSweep, DryRun: !a.Approve}
	if err := a.check(); err != nil {
		return res, err
	}
	if st == nil {
		return res, &ArgError{Field: "store", Reason: "required"}
	}
	opts.DryRun = !a.Approve
	exists := func(ctx context.Context, id string) (bool, error) {
		_, err := o.Message(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	r, err := st.Sweep(ctx, exists, opts)
	res.SweepResult = r
	if err != nil || !a.Approve {
		return res, err
	}
	filter := map[string]any{"grace": opts.Grace.String(), "retention": opts.Retention.String(), "orphans": r.Orphans}
	res.AuditID, err = o.writeAudit(ctx, o.db.Executor(), ActionClaimCheckSweep, a, filter, nil, int64(r.Deleted))
	return res, err
}
