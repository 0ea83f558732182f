package ops_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/ops"
)

// TestEvidenceNeverCallsPendingUnpublished (issue #23): a pending row may
// be one the broker already holds (a relay marks only after the ack, and a
// relay killed in between — or a CDC relay whose slot passed the row —
// leaves it pending), so evidence reads it as "unknown" with the reason,
// never as "not yet published". Once a relay records the ack, it reads
// "published"; a dead row reads "dead". On a database with a CDC slot
// recorded, the reason names the slot and its reconciler.
func TestEvidenceNeverCallsPendingUnpublished(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("o-1", "order.created"), event("o-2", "order.created"))
		id, dead := evs[0].ID.String(), evs[1].ID.String()
		read := func(id string) ops.EventEvidence {
			t.Helper()
			ev, err := e.ops.Evidence(ctx, id, ops.KindEventID)
			if err != nil || len(ev.Events) != 1 || ev.Events[0].Published == nil {
				t.Fatalf("evidence %s: %+v, %v", id, ev, err)
			}
			return ev.Events[0]
		}
		x := read(id)
		if x.Published.Broker != ops.BrokerUnknown || x.Published.UnknownReason == "" {
			t.Fatalf("pending row: broker %q reason %q, want %q with a reason", x.Published.Broker, x.Published.UnknownReason, ops.BrokerUnknown)
		}
		if strings.Contains(x.Summary, "not yet published") || !strings.Contains(x.Summary, "publication unknown") {
			t.Fatalf("pending row summary %q claims to know the broker", x.Summary)
		}
		if e.dialect == driver.Postgres {
			mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (slot_name, publication) VALUES ('slot_x', 'pub_x')`, tn("cdc_slot")))
			if r := read(id).Published.UnknownReason; !strings.Contains(r, "slot_x") || !strings.Contains(r, "reconciler") {
				t.Fatalf("with a CDC slot recorded, the reason %q does not name it", r)
			}
		}
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = CURRENT_TIMESTAMP, broker_receipt = '{"broker":"nats","offset":7}' WHERE event_id = $1`, tn("outbox")), id)
		x = read(id)
		if x.Published.Broker != ops.BrokerPublished || x.Published.UnknownReason != "" || !strings.Contains(x.Summary, "published once") {
			t.Fatalf("sent row: broker %q reason %q summary %q", x.Published.Broker, x.Published.UnknownReason, x.Summary)
		}
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'dead', last_error = 'too large' WHERE event_id = $1`, tn("outbox")), dead)
		if b := read(dead).Published.Broker; b != ops.BrokerDead {
			t.Fatalf("dead row: broker %q, want %q", b, ops.BrokerDead)
		}
	})
}
