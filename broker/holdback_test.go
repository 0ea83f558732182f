package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

func TestHoldBack(t *testing.T) {
	ev := func(tenant, agg string) *ferry.Event {
		return &ferry.Event{ID: uuid.New(), TenantID: tenant, AggregateType: "order", AggregateID: agg}
	}
	a1, a2, a3, b1, otherTenant := ev("t", "A"), ev("t", "A"), ev("t", "A"), ev("t", "B"), ev("u", "A")
	var hb HoldBack
	if err := hb.Held("x", a1); err != nil {
		t.Fatalf("nothing failed yet, a1 held: %v", err)
	}
	hb.Fail(a1)
	err := hb.Held("x", a2)
	if err == nil || ClassOf(err) != ClassNotSent || !errors.Is(err, ErrNotSent) {
		t.Fatalf("a2 after a1 failed: %v (class %s), want ClassNotSent", err, ClassOf(err))
	}
	if !strings.Contains(err.Error(), a1.ID.String()) || !strings.Contains(err.Error(), a2.ID.String()) ||
		!strings.HasPrefix(err.(*PublishError).Err.Error(), "x: ") {
		t.Fatalf("held error does not name the system, the event and the earlier one: %v", err)
	}
	if errors.Is(err, ErrDestinationMissing) || errors.Is(err, ErrPermanent) {
		t.Fatalf("held error carries the earlier failure's marks: %v", err)
	}
	hb.Fail(a2) // a later failure does not replace the first
	if err := hb.Held("x", a3); err == nil || !strings.Contains(err.Error(), a1.ID.String()) {
		t.Fatalf("a3: %v, want held naming a1", err)
	}
	if err := hb.Held("x", b1); err != nil {
		t.Fatalf("another aggregate held: %v", err)
	}
	if err := hb.Held("x", otherTenant); err != nil {
		t.Fatalf("the same aggregate id of another tenant held: %v", err)
	}
}

func TestRefuseEmptyTopic(t *testing.T) {
	var hb HoldBack
	a1 := &ferry.Event{ID: uuid.New(), TenantID: "t", AggregateType: "order", AggregateID: "A"}
	a2 := &ferry.Event{ID: uuid.New(), TenantID: "t", AggregateType: "order", AggregateID: "A", Topic: "orders"}
	b1 := &ferry.Event{ID: uuid.New(), TenantID: "t", AggregateType: "order", AggregateID: "B", Topic: "orders"}
	err := hb.Refuse("x", 0, a1)
	if ClassOf(err) != ClassPermanent || !strings.Contains(err.Error(), "topic is empty") {
		t.Fatalf("event without a topic: %v, want ClassPermanent naming the topic", err)
	}
	if err := hb.Refuse("x", 1, a2); ClassOf(err) != ClassNotSent {
		t.Fatalf("later event of its aggregate: %v, want held (ClassNotSent)", err)
	}
	if err := hb.Refuse("x", 2, b1); err != nil {
		t.Fatalf("other aggregate refused: %v", err)
	}
}
