package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/deploy"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
)

// The inbox and effect alerts fire from the collector's gauges: an old
// open gap, an old parked message, an unknown effect, a dead letter, and
// the soft cap; and stay quiet once those rows are resolved.
func TestCollectorDrivesInboxAndEffectAlerts(t *testing.T) {
	if _, err := deploy.Promtool(); err != nil {
		testenv.Unavailable(t, "%v", err) // skips, or fails under FERRY_REQUIRE_SERVICES=1
	}
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		reg := prometheus.NewRegistry()
		reg.MustRegister(ops.NewCollector(e.ops, ops.WithCaps(1, 10)))
		// expect asks promtool whether the shipped rules select exactly
		// these label sets on what the collector exports now.
		expect := func(stage string, want map[string][]map[string]string) {
			t.Helper()
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if err := deploy.CheckFiring(ctx, deploy.AlertRulesYAML, fams, want); err != nil {
				t.Fatalf("%s: %v", stage, err)
			}
		}
		expect("empty database", nil)

		old := time.Now().Add(-20 * time.Minute).UTC()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"), event("3", "order.created"))
		markDead(t, e, evs[0].ID.String())
		for i, reason := range []string{"gap", "poison"} {
			mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen, tenant_id, aggregate_type, aggregate_id, aggregate_seq)
VALUES ('billing', $1, $2, $3, $3, 'acme', 'order', '9', $4)`, tn("inbox_parked")), reason, fmt.Sprint("k", i), old, i+5)
		}
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, target, operation, request, request_sha, state,
    next_attempt_at, created_at, updated_at, unknown_since) VALUES ('fx1_a', 'billing', $1, 'charge', 'psp', 'charge', $2, $2, 'unknown', $3, $3, $3, $3)`,
			tn("effects")), uuid.NewString(), []byte("x"), old)

		expect("faults injected", map[string][]map[string]string{
			"FerryDeadLetters":       {{"topic": "order.events"}},
			"FerryGapOpen":           {{"consumer": "billing"}},
			"FerryParkedMessagesOld": {{"consumer": "billing", "reason": "gap"}, {"consumer": "billing", "reason": "poison"}},
			"FerryUnknownEffects":    {{"consumer": "billing"}},
			"FerryOutboxOverSoftCap": {{}},
			"FerryShardsUnowned":     {{}},
		})
		st, err := e.ops.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Consumers) != 1 || st.Consumers[0].OpenGaps != 1 || st.Consumers[0].OldestGapAge < 1190 ||
			len(st.Effects) != 1 || st.Effects[0].ByState["unknown"] != 1 || st.Effects[0].OldestUnknownAge < 1190 {
			t.Fatalf("status consumers %+v effects %+v", st.Consumers, st.Effects)
		}

		// Resolved: the alerts clear.
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET resolved_at = $1, resolution = 'applied'`, tn("inbox_parked")), time.Now().UTC())
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET state = 'succeeded', unknown_since = NULL, completed_at = $1`, tn("effects")), time.Now().UTC())
		if _, err := e.ops.DiscardDead(ctx, ops.Filter{All: true}, approve); err != nil {
			t.Fatal(err)
		}
		// The two pending rows stay over the soft cap of 1, with no relay.
		expect("resolved", map[string][]map[string]string{
			"FerryOutboxOverSoftCap": {{}},
			"FerryShardsUnowned":     {{}},
		})
	})
}
