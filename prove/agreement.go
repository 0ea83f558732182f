package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/ops"
)

// stateMismatches is the state_mismatch invariant, run after settling for
// every scenario: for every committed event, the outbox table's record of
// the publication, the broker's stream and `ferry evidence` (package ops)
// agree.
//
//   - on the broker ⇔ the row says sent: a row still 'pending' (or 'dead')
//     for an event the broker holds is the phantom backlog of issue #23; a
//     row 'sent' without a stored copy claims a publication that did not
//     happen;
//   - a sent row's receipt is readable and, where the broker has storage
//     positions (JetStream sequence, Kafka partition/offset), names a
//     stored copy of that very event;
//   - evidence reads the row as the table says (sent → published, pending →
//     unknown, dead → dead) and never claims "published" for an event the
//     broker lacks.
//
// Rows a cleanup deleted (known only from the snapshot) are skipped: their
// table record is gone by design. It returns one line per disagreeing
// event, sorted.
func (e *env) stateMismatches(ctx context.Context, t *truth) ([]string, error) {
	// byWatermark: sent by its shard's watermark, the row never written
	// (the watermark design stores no receipt for it).
	type row struct {
		status, receipt string
		byWatermark     bool
	}
	rows := map[string]row{}
	if err := scanRows(ctx, e.db.drv.Executor(), `SELECT event_id, `+e.outboxStatus("o")+`, status, COALESCE(broker_receipt, '') FROM ferry_outbox o`, func(s func(...any) error) error {
		var id, column string
		var r row
		if err := s(&id, &r.status, &column, &r.receipt); err != nil {
			return err
		}
		r.byWatermark = r.status == "sent" && column == "pending"
		switch {
		case r.byWatermark:
			t.sentByWatermark++
		case r.status == "sent":
			t.sentByStatus++
		}
		rows[id] = r
		return nil
	}); err != nil {
		return nil, err
	}
	type pos struct {
		partition int32
		offset    int64
	}
	copies := map[string][]pos{}
	for _, m := range t.stream {
		if m.EventID != "" {
			copies[m.EventID] = append(copies[m.EventID], pos{m.partition, m.offset})
		}
	}
	positions := e.tr.kind() != "rabbitmq" // AMQP keeps no storage position
	o, err := ops.New(e.db.drv, ops.WithLogger(e.log))
	if err != nil {
		return nil, fmt.Errorf("prove: state check: %w", err)
	}
	ids := make([]string, 0, len(t.business))
	for id := range t.business {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []string
	for _, id := range ids {
		r, ok := rows[id]
		if !ok {
			continue // cleaned up (or no row at all: G1 reports that)
		}
		held := copies[id]
		var why string
		switch {
		case len(held) > 0 && r.status != "sent":
			why = fmt.Sprintf("the broker holds %d copies but the table says %s", len(held), r.status)
		case len(held) == 0 && r.status == "sent":
			why = "the table says sent but the broker holds no copy"
		case r.status == "sent" && !r.byWatermark:
			var rc broker.Receipt
			if err := json.Unmarshal([]byte(r.receipt), &rc); err != nil || rc.Broker == "" {
				why = fmt.Sprintf("sent with no readable receipt (%q)", r.receipt)
				break
			}
			if !positions {
				break
			}
			found := false
			for _, p := range held {
				if p.offset == rc.Offset && (e.tr.kind() != "kafka" || p.partition == rc.Partition) {
					found = true
				}
			}
			if !found {
				why = fmt.Sprintf("the receipt names partition %d offset %d, where the broker holds no copy of it", rc.Partition, rc.Offset)
			}
		}
		if why == "" {
			ev, err := o.Evidence(ctx, id, ops.KindEventID)
			if err != nil {
				return nil, fmt.Errorf("prove: state check: evidence %s: %w", id, err)
			}
			why = evidenceDisagrees(ev, r.status, len(held) > 0)
		}
		if why != "" {
			out = append(out, fmt.Sprintf("state_mismatch: event %s: %s", id, why))
		}
	}
	return out, nil
}

// evidenceDisagrees checks ops evidence against the table's status and
// the broker ("" when it agrees with both).
func evidenceDisagrees(ev ops.Evidence, status string, onBroker bool) string {
	if len(ev.Events) != 1 || ev.Events[0].Published == nil {
		return "ferry evidence finds no outbox row"
	}
	got := ev.Events[0].Published.Broker
	want := map[string]string{"sent": ops.BrokerPublished, "pending": ops.BrokerUnknown, "dead": ops.BrokerDead}[status]
	switch {
	case got == ops.BrokerPublished && !onBroker:
		return "ferry evidence says published but the broker holds no copy"
	case onBroker && got != ops.BrokerPublished && got != ops.BrokerUnknown:
		return fmt.Sprintf("ferry evidence says %s but the broker holds it", got)
	case want != "" && got != want && ev.Events[0].Published.Discarded == nil:
		return fmt.Sprintf("ferry evidence says %s for a %s row", got, status)
	}
	return ""
}
