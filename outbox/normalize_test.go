package outbox

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

func TestNormalizeAssignsButKeeps(t *testing.T) {
	given := uuid.Must(uuid.NewV7())
	e := ferry.Event{ID: given, TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	if err := normalize(0, &e, "", 16, now); err != nil {
		t.Fatal(err)
	}
	if e.ID != given || e.ContentType != ferry.DefaultContentType || e.Topic != "order.events" || e.OccurredAt.Location() != time.UTC || !e.OccurredAt.Equal(now) {
		t.Fatalf("normalized = %+v", e)
	}
	if want := ferry.ShardFor("acme", "order", "o-1", 16); e.Shard != want {
		t.Fatalf("shard %d, want %d", e.Shard, want)
	}
	// A rendered topic too long for the broker is refused, naming the event.
	long := ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1}
	tmpl := ferry.TopicTemplate("{tenant_id}.{aggregate_type}")
	long.TenantID = strings.Repeat("t", 250)
	if err := normalize(2, &long, tmpl, 16, now); err == nil {
		t.Fatal("a 250+ byte rendered topic was accepted")
	}
}
