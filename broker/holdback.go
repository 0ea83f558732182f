package broker

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

// HoldBack keeps per-aggregate order within one Publish call: once an
// event fails before it was sent (an empty topic, too large, refused by
// the client), the later events of its aggregate in the same call are not
// sent either, so the broker never stores event n+1 of an aggregate
// without event n because of this call. Every adapter's Publish uses one:
//
//	var hb broker.HoldBack
//	for i := range events {
//		if err := hb.Refuse("kafka", i, &events[i]); err != nil {
//			results[i].Err = err
//			continue
//		}
//		if err := send(&events[i]); err != nil {
//			results[i].Err = err
//			hb.Fail(&events[i])
//		}
//	}
//
// The zero value is ready; it is not safe for concurrent use (one Publish
// call, one goroutine).
type HoldBack struct {
	failed map[string]uuid.UUID // aggregate key → first failed event
}

// Held returns a ClassNotSent error when an earlier event of ev's
// aggregate failed before sending in this call, else nil. system names
// the adapter in the message ("kafka").
func (h *HoldBack) Held(system string, ev *ferry.Event) error {
	if h.failed == nil {
		return nil
	}
	key := ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID)
	first, ok := h.failed[key]
	if !ok {
		return nil
	}
	return NewError(ClassNotSent,
		fmt.Errorf("%s: event %s not sent: earlier event %s of aggregate %s failed in this call", system, ev.ID, first, key))
}

// Refuse is the check before sending events[i]: Held's error, or, for an
// event without a topic, a ClassPermanent error (and its aggregate is held
// from then on); nil means send it. Adapters whose destination is not the
// topic itself (natsjs derives a subject) call Held and check their own.
func (h *HoldBack) Refuse(system string, i int, ev *ferry.Event) error {
	if err := h.Held(system, ev); err != nil {
		return err
	}
	if ev.Topic == "" {
		h.Fail(ev)
		return NewError(ClassPermanent, fmt.Errorf("%s: event[%d] %s: topic is empty", system, i, ev.ID))
	}
	return nil
}

// Fail records that ev failed before it was sent: the later events of its
// aggregate in this call are held.
func (h *HoldBack) Fail(ev *ferry.Event) {
	if h.failed == nil {
		h.failed = make(map[string]uuid.UUID)
	}
	key := ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID)
	if _, ok := h.failed[key]; !ok {
		h.failed[key] = ev.ID
	}
}
