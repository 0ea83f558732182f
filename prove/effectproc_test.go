package prove

import (
	"strings"
	"testing"
)

// TestEffectSigkillCheckerCanFail: the effect-worker-sigkill checker
// passes a clean run and reports each way the books and the ledger can
// disagree with "one charge per paid order, every intent succeeded, the
// window exercised and reconciled". A paid order never charged is the
// generic checker's missing effects (TestMissingEffectsAtDeadline).
func TestEffectSigkillCheckerCanFail(t *testing.T) {
	const ev, ev2 = "0190c3d2-0000-7000-8000-000000000001", "0190c3d2-0000-7000-8000-000000000002"
	k, k2 := key(ev), key(ev2)
	setup := func() (*env, *Figures, *truth) {
		e := &env{plan: &plan{events: map[string]*plannedEvent{
			ev:  {id: ev, kind: "order.paid"},
			ev2: {id: ev2, kind: "order.paid"},
		}}, provider: newFakeProvider()}
		e.provider.charges[ev], e.provider.charges[ev2] = 1, 1
		e.provider.cut[k] = true
		e.provider.found[k] = 1
		f := &Figures{FaultsInjected: sigkillKills, Reconciliations: 1}
		tr := &truth{business: map[string]bool{ev: true, ev2: true}, effects: []ledgerEffect{
			{key: k, eventID: ev, state: "succeeded", reconciliations: 1},
			{key: k2, eventID: ev2, state: "succeeded"},
		}}
		return e, f, tr
	}
	e, f, tr := setup()
	if v := checkEffectSigkill(e, f, tr); len(v) != 0 {
		t.Fatalf("clean run reported %v", v)
	}
	if f.ChargesResponseLost != 1 || f.ReconciledFound != 1 {
		t.Fatalf("figures %+v", f)
	}
	for name, c := range map[string]struct {
		breakIt func(*env, *Figures, *truth)
		want    string
	}{
		"window not hit":     {func(e *env, _ *Figures, _ *truth) { delete(e.provider.cut, k) }, "window was not exercised"},
		"cut not reconciled": {func(e *env, _ *Figures, _ *truth) { delete(e.provider.found, k) }, "not resolved by a status query"},
		"intent unfinished":  {func(_ *env, _ *Figures, tr *truth) { tr.effects[1].state = "unknown" }, "not ended succeeded"},
		"no ledger row":      {func(_ *env, _ *Figures, tr *truth) { tr.effects = tr.effects[:1] }, "without a ledger intent"},
		"kills missing":      {func(_ *env, f *Figures, _ *truth) { f.FaultsInjected = 2 }, "2 kills"},
		"no reconciliation":  {func(_ *env, f *Figures, _ *truth) { f.Reconciliations = 0 }, "no reconciliation"},
	} {
		e, f, tr := setup()
		c.breakIt(e, f, tr)
		v := checkEffectSigkill(e, f, tr)
		if !strings.Contains(strings.Join(v, "; "), c.want) {
			t.Errorf("%s: want a violation containing %q, got %v", name, c.want, v)
		}
	}
}
