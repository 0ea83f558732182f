package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/encrypt"
)

// ActionEraseSubject is the audit action of EraseSubject.
const ActionEraseSubject = "subject.erase"

// EraseRequest names the data subject to erase: the tenant and the
// subject the producer's encrypt.Rule.Subject returned (e.g. a customer id).
type EraseRequest struct {
	TenantID string `json:"tenant_id"`
	Subject  string `json:"subject"`
}

// EraseResult lists the subject's keys: the live one a dry run would
// destroy (Rows counts live keys), or the one an approved run destroyed,
// and any destroyed before.
type EraseResult = ActionResult[encrypt.SubjectKey]

// EraseSubject crypto-shreds one data subject: it destroys the subject's
// data key (encrypt.SubjectKeys.EraseTx), which makes every payload sealed
// under it unreadable wherever a copy lives — outbox rows, broker
// streams, archives, parked inbox rows — while event ids, sequences,
// receipts and the audit trail stay as they are, so dedup and order keep
// working and consumers park such events with reason decrypt.
//
// Without a.Approve it is a dry run that lists the keys. With it, the key
// is destroyed and one audit row is written in the same transaction; the
// audit row records the tenant and the subject's SHA-256 digest, never the
// subject's name (put no name in the reason either). Erasing a subject
// with no live key is ErrNotFound. Irreversible.
func (o *Ops) EraseSubject(ctx context.Context, req EraseRequest, a Approval) (EraseResult, error) {
	res := EraseResult{Action: ActionEraseSubject, DryRun: !a.Approve}
	if err := a.check(); err != nil {
		return res, err
	}
	if strings.TrimSpace(req.TenantID) == "" || len(req.TenantID) > 128 {
		return res, &ArgError{Field: "tenant", Reason: "must be 1..128 bytes (the events' tenant_id)"}
	}
	sk, err := encrypt.NewSubjectKeys(o.cfg.tables)
	if err != nil {
		return res, err
	}
	var erased int64
	run := func(exec driver.Executor) error {
		keys, err := sk.Lookup(ctx, exec, req.TenantID, req.Subject)
		if err != nil && !errors.Is(err, encrypt.ErrNoSubjectKey) {
			return err
		}
		live := []string{}
		for _, k := range keys {
			if k.ErasedAt == nil {
				live = append(live, k.Handle)
			}
		}
		res.Rows = int64(len(live))
		if !a.Approve {
			res.Sample = keys
			return nil
		}
		if len(live) == 0 {
			if len(keys) > 0 {
				return fmt.Errorf("%w: the subject's keys (%d) are already erased", ErrNotFound, len(keys))
			}
			return fmt.Errorf("%w: no key for this tenant and subject (no encrypted event named it)", ErrNotFound)
		}
		if erased, err = sk.EraseTx(ctx, exec, req.TenantID, req.Subject, o.now()); err != nil {
			return err
		}
		filter := map[string]string{"tenant_id": req.TenantID, "subject_digest": encrypt.SubjectDigest(req.TenantID, req.Subject)}
		if res.AuditID, err = o.writeAudit(ctx, exec, ActionEraseSubject, a, filter, live, erased); err != nil {
			return err
		}
		after, err := sk.Lookup(ctx, exec, req.TenantID, req.Subject)
		if err != nil {
			return err
		}
		res.Sample = after
		return nil
	}
	if !a.Approve {
		return res, run(o.db.Executor())
	}
	if err := o.inTx(ctx, func(tx driver.Tx) error { return run(tx) }); err != nil {
		return res, err
	}
	res.Rows = erased
	return res, nil
}
