package ferrytest

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

var twoEvents = []ferry.Event{
	{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{"a":1}`)},
	{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", SchemaVersion: 1},
}

func check(t *testing.T, exec driver.Executor) {
	t.Helper()
	got := RequireInserted(t, exec, ferry.Tables{},
		Want{EventType: "order.created", AggregateID: "o-1", AggregateSeq: 1},
		Want{EventType: "order.paid", AggregateSeq: 2})
	if string(got[0].Payload) != `{"a":1}` || got[0].OccurredAt.IsZero() || got[0].Topic != "order.events" {
		t.Fatalf("read back %+v", got[0])
	}
	// The helper must be able to fail: a wrong expectation is reported.
	if msg := diff(got, []Want{{EventType: "order.paid"}}); !strings.Contains(msg, "have 2 events, want 1") || !strings.Contains(msg, "[0] have") {
		t.Fatalf("diff did not report the mismatch: %q", msg)
	}
}

func TestRequireInsertedSQLite(t *testing.T) {
	ctx := context.Background()
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Insert(ctx, twoEvents...); err != nil {
		t.Fatal(err)
	}
	check(t, drv.Executor())
}

func TestRequireInsertedPostgres(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Insert(ctx, twoEvents...); err != nil {
		t.Fatal(err)
	}
	check(t, drv.Executor())
}
