package prove

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// fakeProvider stands in for a payment provider that does NOT deduplicate
// by key (many email, SMS and legacy payment APIs do not): every charge
// call moves money. It keeps its own books — the ground truth for
// duplicate effects — and answers status queries by reference.
type fakeProvider struct {
	mu          sync.Mutex
	charges     map[string]int  // event id -> charges executed
	byRef       map[string]bool // reference -> a charge exists
	calls       int
	statusCalls int
	// found counts, per reference, status queries that found the charge:
	// each is an outcome the ledger had not recorded.
	found map[string]int
	// Over HTTP (providerServer): cut holds the references whose charge
	// was applied but whose response the caller never read (its process
	// died while the provider held the response); held counts, per
	// caller, responses being held right now.
	cut  map[string]bool
	held map[string]int
	// pins, per caller, keep its held responses held until the caller is
	// gone or the pin is released: an aimed kill pins its target, so the
	// kill lands in the window however long it takes to land.
	pins map[string]chan struct{}
	// late counts charge requests refused because they arrived after
	// their call's deadline (over HTTP: X-Prove-Deadline).
	late int
}

func newFakeProvider() *fakeProvider {
	return &fakeProvider{charges: map[string]int{}, byRef: map[string]bool{}, found: map[string]int{},
		cut: map[string]bool{}, held: map[string]int{}, pins: map[string]chan struct{}{}}
}

func (p *fakeProvider) charge(ref, eventID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.charges[eventID]++
	p.byRef[ref] = true
}

func (p *fakeProvider) status(ref string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statusCalls++
	if p.byRef[ref] {
		p.found[ref]++
	}
	return p.byRef[ref]
}

// refEffects is prove's reference effect worker over the ledger: claim
// pending → in_flight (committed before the call), call, then succeeded.
// An in_flight row found later has an unknown outcome and is resolved by a
// status query, never by a blind retry.
type refEffects struct {
	env          *env
	unknownAfter time.Duration
}

func (w *refEffects) run(ctx context.Context) error {
	for ctx.Err() == nil {
		n, err := w.once(ctx)
		if err == errCrash {
			return err
		}
		if err != nil {
			w.env.rec.err(err)
		}
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

type ledgerRow struct {
	key, eventID, status string
	updated              int64
}

func (w *refEffects) once(ctx context.Context) (int, error) {
	exec := w.env.db.drv.Executor()
	stale := time.Now().Add(-w.unknownAfter).UnixNano()
	rows, err := exec.Query(ctx, `SELECT idem_key, event_id, status, updated_at FROM prove_ledger WHERE status = 'pending' OR (status = 'in_flight' AND updated_at < $1) ORDER BY updated_at LIMIT 50`, stale)
	if err != nil {
		return 0, fmt.Errorf("effects: fetch: %w", err)
	}
	var todo []ledgerRow
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.key, &r.eventID, &r.status, &r.updated); err != nil {
			rows.Close()
			return 0, fmt.Errorf("effects: scan: %w", err)
		}
		todo = append(todo, r)
	}
	rows.Close()
	for _, r := range todo {
		now := time.Now().UnixNano()
		// Claim the row (or re-claim an unknown one) with a compare-and-set,
		// so two workers never both call.
		n, err := exec.Exec(ctx, `UPDATE prove_ledger SET status = 'in_flight', attempts = attempts + 1, updated_at = $1 WHERE idem_key = $2 AND status = $3 AND updated_at = $4`,
			now, r.key, r.status, r.updated)
		if err != nil {
			return 0, fmt.Errorf("effects: claim: %w", err)
		}
		if n == 0 {
			continue
		}
		if r.status == "in_flight" && w.env.provider.status(r.key) {
			// Reconciled: the provider has it; record, do not call again.
			w.env.log.InfoContext(ctx, "prove: effect reconciled", slog.String("key", r.key))
		} else {
			w.env.provider.charge(r.key, r.eventID)
			if w.env.fire(faultEffectCrash, r.eventID) {
				return 0, errCrash // provider succeeded, ledger never told
			}
		}
		if _, err := exec.Exec(ctx, `UPDATE prove_ledger SET status = 'succeeded', updated_at = $1 WHERE idem_key = $2`, time.Now().UnixNano(), r.key); err != nil {
			return 0, fmt.Errorf("effects: record: %w", err)
		}
	}
	return len(todo), nil
}
