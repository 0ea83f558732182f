package ops_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// An outage outlasts the effect worker's attempts, so its intents fail;
// an operator lists them, previews and approves a requeue of one target's;
// the worker then runs them again with the same keys and the provider
// applies each exactly once. The other target's failure is left alone, and
// the requeue is audited.
func TestRequeueFailedEffects(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		s := testenv.NewPostgresSchema(t)
		requeueScenario(t, pgxv5.New(s.Pool))
	})
	t.Run("sqlite", func(t *testing.T) {
		db, _ := testenv.NewSQLite(t)
		requeueScenario(t, sqlite.New(db))
	})
	t.Run("mysql", func(t *testing.T) {
		requeueScenario(t, mysql.New(testenv.NewMySQLDatabase(t).DB))
	})
}

// provider is a fake outside system that honours idempotency keys.
type provider struct {
	down    atomic.Bool
	mu      sync.Mutex
	applied map[string]int
}

func (p *provider) Execute(_ context.Context, in effect.Intent) (effect.Result, error) {
	if p.down.Load() {
		return effect.Result{}, effect.NotSent(errors.New("connection refused"))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied[in.Key]++
	return effect.Result{OperationID: "op-" + in.Key[:12], Summary: "ok"}, nil
}

func (p *provider) Status(_ context.Context, in effect.Intent) (effect.Status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.applied[in.Key] > 0 {
		return effect.Status{Lookup: effect.LookupFound, OperationID: "op-" + in.Key[:12]}, nil
	}
	return effect.Status{Lookup: effect.LookupNotFound}, nil
}

func requeueScenario[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, tables); err != nil {
		t.Fatal(err)
	}
	db, ok := any(drv).(ops.DB)
	if !ok {
		t.Fatalf("%T is not an ops.DB", drv)
	}
	o, err := ops.New(db, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := effect.NewLedger(drv, effect.WithTables(tables))
	if err != nil {
		t.Fatal(err)
	}
	var payKeys []string
	for i, target := range []string{"payments", "payments", "payments", "mail"} {
		ttx, tx, err := drv.BeginTx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		key, err := ledger.RecordTx(ctx, ttx, effect.Intent{Consumer: "billing", EventID: uuid.Must(uuid.NewV7()), Step: "step",
			TenantID: "acme", Target: target, Operation: "call", Request: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if target == "payments" {
			payKeys = append(payKeys, key)
		}
	}
	p := &provider{applied: map[string]int{}}
	p.down.Store(true)
	w, err := effect.NewWorker(ledger, p, p, effect.WithMaxAttempts(2), effect.WithBackoff(time.Millisecond, 2*time.Millisecond),
		effect.WithBreaker(1000, time.Millisecond), effect.WithPollInterval(time.Millisecond),
		effect.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	exec := drv.Executor()
	states := func() map[string]int64 {
		t.Helper()
		rows, err := exec.Query(ctx, `SELECT state, count(*) FROM `+tn("effects")+` GROUP BY state`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]int64{}
		for rows.Next() {
			var s string
			var n int64
			if err := rows.Scan(&s, &n); err != nil {
				t.Fatal(err)
			}
			m[s] = n
		}
		return m
	}
	work := func(what string, done func(map[string]int64) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !done(states()); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: states %v", what, states())
			}
			if _, err := w.Work(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	work("outage outlasts the attempts", func(m map[string]int64) bool { return m["failed"] == 4 })

	failed, err := o.ListFailedEffects(ctx, ops.EffectFilter{Target: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 3 || failed[0].Consumer != "billing" || failed[0].Attempts != 2 || !strings.Contains(failed[0].LastError, "connection refused") ||
		failed[0].CompletedAt == nil || failed[0].EventID == "" || failed[0].TenantID != "acme" {
		t.Fatalf("failed payments: %+v", failed)
	}
	if all, err := o.ListFailedEffects(ctx, ops.EffectFilter{ErrorContains: "refused"}); err != nil || len(all) != 4 {
		t.Fatalf("by error text: %d, %v; want 4", len(all), err)
	}

	if _, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{}, ops.Approval{Approve: true, Actor: "alice", Reason: "x"}); !errors.Is(err, ops.ErrEmptyFilter) {
		t.Fatalf("empty filter: %v, want ErrEmptyFilter", err)
	}
	if _, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{Target: "payments"}, ops.Approval{Approve: true, Actor: "alice"}); !errors.Is(err, ops.ErrReasonRequired) {
		t.Fatalf("no reason: %v, want ErrReasonRequired", err)
	}
	if _, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{Keys: []string{""}}, ops.Approval{}); err == nil || !strings.Contains(err.Error(), "filter.keys[0]") {
		t.Fatalf("empty key: %v, want an error naming filter.keys[0]", err)
	}
	preview, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{Target: "payments"}, ops.Approval{})
	if err != nil || !preview.DryRun || preview.Rows != 3 || len(preview.Sample) != 3 || preview.AuditID != 0 {
		t.Fatalf("preview: %+v, %v", preview, err)
	}
	if m := states(); m["failed"] != 4 {
		t.Fatalf("the preview changed rows: %v", m)
	}

	p.down.Store(false) // the outage is over
	res, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{Target: "payments"}, ops.Approval{Approve: true, Actor: "alice", Reason: "provider outage INC-42 is over"})
	if err != nil || res.DryRun || res.Rows != 3 || res.AuditID == 0 {
		t.Fatalf("requeue: %+v, %v", res, err)
	}
	if m := states(); m["failed"] != 1 || m["pending"] != 3 {
		t.Fatalf("after requeue: %v; want 3 pending, the mail intent still failed", m)
	}
	if rec, ok, err := effect.ByKey(ctx, exec, tables, payKeys[0]); err != nil || !ok || rec.State != effect.StatePending || rec.Attempts != 0 ||
		!strings.Contains(rec.LastError, "requeued (audit ") || !strings.Contains(rec.LastError, "connection refused") {
		t.Fatalf("ledger row after requeue: %+v %v %v", rec, ok, err)
	}
	work("requeued intents run", func(m map[string]int64) bool { return m["succeeded"] == 3 })
	for _, k := range payKeys {
		if p.applied[k] != 1 {
			t.Fatalf("key %s applied %d times, want 1 (applied: %v)", k, p.applied[k], p.applied)
		}
	}
	if rec, ok, err := effect.ByKey(ctx, exec, tables, payKeys[0]); err != nil || !ok || rec.State != effect.StateSucceeded || rec.Attempts != 1 {
		t.Fatalf("ledger row after the requeued run: %+v %v %v", rec, ok, err)
	}
	again, err := o.RequeueFailedEffects(ctx, ops.EffectFilter{Target: "payments"}, ops.Approval{Approve: true, Actor: "alice", Reason: "again"})
	if err != nil || again.Rows != 0 {
		t.Fatalf("second requeue: %+v, %v; want nothing to requeue", again, err)
	}
	audit, err := o.Audit(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, a := range audit {
		if a.ID == res.AuditID {
			found = a.Action == "effects.requeue" && a.Actor == "alice" && a.RowCount == 3 && strings.Contains(a.IDs, payKeys[0])
		}
	}
	if !found {
		t.Fatalf("audit row %d for the requeue missing or wrong: %+v", res.AuditID, audit)
	}
}
