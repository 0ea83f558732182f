package ops

import (
	"context"

	"github.com/ferryhq/ferry/encrypt"
)

// ActionRewrapSubjectKeys is the audit action of RewrapSubjectKeys.
const ActionRewrapSubjectKeys = "subject_keys.rewrap"

// RewrapResult says how many subject keys were (dry run: would be)
// re-wrapped under the keyring's current KEK, by the KEK they left.
type RewrapResult struct {
	Action  string           `json:"action"`
	DryRun  bool             `json:"dry_run"`
	To      string           `json:"to"`
	Rows    int64            `json:"rows"`
	From    map[string]int64 `json:"from"`
	Batches int              `json:"batches,omitempty"`
	AuditID int64            `json:"audit_id,omitempty"`
}

// RewrapSubjectKeys re-wraps every live subject key under ring's current
// KEK (encrypt.RewrapSubjectKeys), so old KEKs can be retired. Without
// a.Approve it is a dry run that counts them by KEK. With it, the keys
// are re-wrapped in batches (each its own transaction) and one audit row
// records the counts afterwards. Erased keys stay erased.
func (o *Ops) RewrapSubjectKeys(ctx context.Context, ring encrypt.Keyring, batch int, a Approval) (RewrapResult, error) {
	res := RewrapResult{Action: ActionRewrapSubjectKeys, DryRun: !a.Approve}
	if err := a.check(); err != nil {
		return res, err
	}
	if ring == nil {
		return res, &ArgError{Field: "keyring", Reason: "required"}
	}
	res.To = ring.CurrentKeyID()
	if !a.Approve {
		from, err := encrypt.PendingRewrap(ctx, o.db.Executor(), o.cfg.tables, res.To)
		if err != nil {
			return res, err
		}
		res.From = from
		for _, n := range from {
			res.Rows += n
		}
		return res, nil
	}
	r, err := encrypt.RewrapSubjectKeys(ctx, o.db, ring, o.cfg.tables, batch)
	res.Rows, res.From, res.Batches = r.Rewrapped, r.From, r.Batches
	if err != nil {
		return res, err
	}
	filter := map[string]any{"to": res.To, "from": res.From}
	if res.AuditID, err = o.writeAudit(ctx, o.db.Executor(), ActionRewrapSubjectKeys, a, filter, nil, res.Rows); err != nil {
		return res, err
	}
	return res, nil
}
