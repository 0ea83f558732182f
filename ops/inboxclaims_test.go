package ops_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/ops"
)

// TestEvidenceInboxClaims: evidence finds every consumer's claim of an
// event in a plain inbox, whose key (consumer, tenant_id, event_id) has no
// index on event_id alone, by walking the key's (consumer, tenant) pairs —
// including the first and the last pair, an empty tenant, and tenants that
// differ only in case — and finds nothing for an event nobody applied.
func TestEvidenceInboxClaims(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		consumers := []string{"a-first", "billing", "shipping", "zz-last"}
		tenants := []string{"", "Acme", "acme", "globex", "zz"}
		target, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
		at := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
		claim := func(consumer, tenant string, id uuid.UUID) {
			mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ($1, $2, $3, $4, 'order', $5, 1, 'order.created', $6)`, tn("inbox")), consumer, tenant, id.String(), []byte{0xfe}, consumer+"/"+tenant, at)
		}
		// Every pair holds some other event's claim; the target is
		// claimed by the first pair, a middle one, and the last pair.
		for _, c := range consumers {
			for _, tenant := range tenants {
				claim(c, tenant, uuid.Must(uuid.NewV7()))
			}
		}
		want := []ops.Applied{{Consumer: "a-first", TenantID: ""}, {Consumer: "billing", TenantID: "acme"}, {Consumer: "zz-last", TenantID: "zz"}}
		for _, w := range want {
			claim(w.Consumer, w.TenantID, target)
		}
		claim("shipping", "globex", other)

		ev, err := e.ops.Evidence(ctx, target.String(), ops.KindEventID)
		if err != nil || len(ev.Events) != 1 {
			t.Fatalf("evidence of an event only the inbox knows: %+v %v", ev, err)
		}
		got := ev.Events[0].Applied
		if len(got) != len(want) {
			t.Fatalf("applied %+v, want %+v", got, want)
		}
		for i := range want {
			if got[i].Consumer != want[i].Consumer || got[i].TenantID != want[i].TenantID || got[i].Fingerprint != "fe" || !got[i].AppliedAt.Equal(at) {
				t.Errorf("applied[%d] = %+v, want %s/%q applied at %v with fingerprint fe", i, got[i], want[i].Consumer, want[i].TenantID, at)
			}
		}
		if ev, err := e.ops.Evidence(ctx, other.String(), ops.KindEventID); err != nil || len(ev.Events) != 1 || len(ev.Events[0].Applied) != 1 ||
			ev.Events[0].Applied[0].Consumer != "shipping" {
			t.Fatalf("evidence of the other event: %+v %v", ev, err)
		}
		if _, err := e.ops.Evidence(ctx, uuid.NewString(), ops.KindEventID); !errors.Is(err, ops.ErrNotFound) {
			t.Fatalf("an event nobody knows: %v, want ErrNotFound", err)
		}
	})
}
