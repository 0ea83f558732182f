package prove

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/effect"
)

// effectExecutor is the fake provider behind package effect's Executor and
// Reconciler interfaces: it charges under the intent's idempotency key and
// answers status queries by that key.
func (e *env) effectExecutor() (effect.Executor, effect.Reconciler) {
	exec := effect.ExecutorFunc(func(_ context.Context, in effect.Intent) (effect.Result, error) {
		e.provider.charge(in.Key, in.EventID.String())
		return effect.Result{OperationID: "ch_" + in.EventID.String()[:8], Summary: "charged"}, nil
	})
	rec := effect.ReconcilerFunc(func(_ context.Context, in effect.Intent) (effect.Status, error) {
		if e.provider.status(in.Key) {
			return effect.Status{Lookup: effect.LookupFound, OperationID: "ch_" + in.EventID.String()[:8]}, nil
		}
		return effect.Status{Lookup: effect.LookupNotFound}, nil
	})
	return exec, rec
}

// recordRealIntent records the payment intent in the consumer's transaction
// through package effect's ledger.
func (e *env) recordRealIntent(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
	l, err := effect.NewLedger(e.db.drv)
	if err != nil {
		return fmt.Errorf("prove: ledger: %w", err)
	}
	_, err = l.RecordTx(ctx, tx, effect.Intent{Consumer: consumerName, EventID: ev.ID, Step: "charge", TenantID: ev.TenantID,
		Target: "payments", Operation: "charge", Request: fmt.Appendf(nil, `{"order":%q}`, ev.AggregateID)})
	if err != nil {
		return fmt.Errorf("prove: record intent: %w", err)
	}
	return nil
}

// runRealEffects runs package effect's worker until ctx ends. A planned
// fault abandons an intent after the provider charged and before the
// ledger heard of it, exactly as a crash there would.
func (e *env) runRealEffects(ctx context.Context) error {
	l, err := effect.NewLedger(e.db.drv)
	if err != nil {
		return fmt.Errorf("prove: ledger: %w", err)
	}
	exec, rec := e.effectExecutor()
	id := "effects-" + randHex(3)
	w, err := effect.NewWorker(l, exec, rec, append(effectTiming(),
		effect.WithWorkerID(id),
		effect.WithLogger(e.log), effect.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"prove_instance": id}, e.reg)),
		effect.WithFaults(effect.Faults{AfterExecuteBeforeRecord: func(in effect.Intent, _ effect.Result, _ error) error {
			if e.fire(faultEffectCrash, in.EventID.String()) {
				return errCrash
			}
			return nil
		}}))...)
	if err != nil {
		return fmt.Errorf("prove: effect worker: %w", err)
	}
	return w.Run(ctx)
}
