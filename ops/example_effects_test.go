package ops_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// An outage outlasted the effect worker's attempts, so a charge failed (it
// was never sent). Once the provider is back, an operator lists failed
// intents and requeues them; the worker runs the charge again with the same
// idempotency key.
func ExampleOps_RequeueFailedEffects() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-ops-effects-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		fmt.Println(err)
		return
	}
	ledger, _ := effect.NewLedger(drv)
	key, _ := ledger.Record(ctx, effect.Intent{Consumer: "billing", EventID: uuid.MustParse("01890f4e-7d1c-7cc0-8a3b-6c2f1e0b9a55"),
		Step: "charge", Target: "payments", Operation: "charge", Request: []byte(`{"amount":100}`)})

	down := true
	provider := effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) {
		if down {
			return effect.Result{}, effect.NotSent(errors.New("connection refused"))
		}
		return effect.Result{OperationID: "ch_1"}, nil
	})
	status := effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
		return effect.Status{Lookup: effect.LookupNotFound}, nil
	})
	worker, err := effect.NewWorker(ledger, provider, status, effect.WithMaxAttempts(1), effect.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = worker.Work(ctx) // the provider is down: the intent fails

	o, _ := ops.New(drv, ops.WithLogger(slog.New(slog.DiscardHandler)))
	failed, _ := o.ListFailedEffects(ctx, ops.EffectFilter{Target: "payments"})
	fmt.Println(len(failed), failed[0].Key == key, failed[0].LastError)

	down = false
	res, _ := o.RequeueFailedEffects(ctx, ops.EffectFilter{Keys: []string{key}},
		ops.Approval{Approve: true, Actor: "alice", Reason: "provider outage INC-42 over"})
	fmt.Printf("requeued %d, audit #%d\n", res.Rows, res.AuditID)

	_, _ = worker.Work(ctx)
	rec, _, _ := effect.ByKey(ctx, drv.Executor(), ferry.Tables{}, key)
	fmt.Println(rec.State, rec.OperationID)
	// Output:
	// 1 true never sent; 1 attempts exhausted: effect: not sent: connection refused
	// requeued 1, audit #1
	// succeeded ch_1
}
