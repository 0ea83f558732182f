package contract_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/contract"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/ferrytest"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func TestMain(m *testing.M) {
	testenv.Announce("contract", testenv.Postgres)
	os.Exit(m.Run())
}

const orderSchema = `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}}`

func orderContracts(t *testing.T) *contract.Set {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(orderSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := contract.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func order(aggID, payload string, version int) ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: aggID, EventType: "order.created",
		SchemaVersion: version, ContentType: "application/json", Payload: []byte(payload)}
}

// producerCase checks outbox.WithContracts on one store: a bad payload (or a
// call holding one) is refused with ErrInvalidEvent naming the JSON path and
// rule, and nothing is written; a good payload is written.
func producerCase[TTx any](t *testing.T, drv driver.Driver[TTx], set *contract.Set) {
	ctx := context.Background()
	w, err := outbox.New(drv, outbox.WithContracts(set))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Insert(ctx, order("o-1", `{"id":"o-1","qty":2}`, 1), order("o-2", `{"id":"o-2","qty":0}`, 1))
	if !errors.Is(err, ferry.ErrInvalidEvent) {
		t.Fatalf("err = %v, want ErrInvalidEvent", err)
	}
	var ve *ferry.ValidationError
	var v *contract.Violation
	if !errors.As(err, &ve) || ve.Index != 1 || ve.Field != "payload" || !errors.As(err, &v) || v.Path != "/qty" || v.Rule != "minimum" {
		t.Fatalf("err = %v, want event[1].payload, path /qty, rule minimum", err)
	}
	if !strings.Contains(err.Error(), "at /qty: rule minimum") {
		t.Errorf("message does not name path and rule: %v", err)
	}
	ferrytest.RequireInserted(t, drv.Executor(), ferry.Tables{})
	if _, err := w.Insert(ctx, order("o-3", `{"id":"o-3"}`, 1)); err == nil || !strings.Contains(err.Error(), `property "qty" is missing`) {
		t.Fatalf("missing required: err = %v", err)
	}
	if _, err := w.Insert(ctx, order("o-4", `{"id":"o-4","qty":1}`, 2)); !errors.Is(err, contract.ErrUnknownVersion) || !errors.Is(err, ferry.ErrInvalidEvent) {
		t.Fatalf("v2 without a contract: err = %v, want ErrUnknownVersion and ErrInvalidEvent", err)
	}
	ferrytest.RequireInserted(t, drv.Executor(), ferry.Tables{})
	if _, err := w.Insert(ctx, order("o-5", `{"id":"o-5","qty":1}`, 1)); err != nil {
		t.Fatalf("valid payload: %v", err)
	}
	ferrytest.RequireInserted(t, drv.Executor(), ferry.Tables{}, ferrytest.Want{AggregateID: "o-5", EventType: "order.created"})
}

func TestProducerContractsSQLite(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	producerCase(t, drv, orderContracts(t))
}

func TestProducerContractsPostgres(t *testing.T) {
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	producerCase(t, drv, orderContracts(t))
}

// consumerCase runs an inbox with WithContracts on one store against a real
// (embedded) JetStream server: the valid event reaches the handler, the one
// breaking its contract and the one at a version without a contract are
// parked with reason schema, with texts that tell them apart; a replay
// after the contract is fixed applies the parked one.
func consumerCase[TTx any](t *testing.T, drv driver.Driver[TTx], set *contract.Set, opts ...inbox.Option) {
	ctx := context.Background()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	nc, err := natsjs.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	subject := "contracttest.order.events"
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: "CONTRACTTEST", Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	var applied atomic.Int64
	handler := func(ctx context.Context, tx TTx, ev ferry.Event) error { applied.Add(1); return nil }
	ib, err := inbox.New(drv, "shipping", handler, append(opts, inbox.WithContracts(set))...)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range []ferry.Event{order("a-1", `{"id":"a-1","qty":1}`, 1), order("a-2", `{"id":"a-2","qty":"many"}`, 1), order("a-3", `{"id":"a-3","qty":1}`, 2)} {
		ev.ID = uuid.Must(uuid.NewV7())
		ev.AggregateSeq = 1
		ev.Topic = subject
		ev.OccurredAt = time.Now().UTC()
		for _, r := range pub.Publish(ctx, []ferry.Event{ev}) {
			if r.Err != nil {
				t.Fatalf("publish %d: %v", i, r.Err)
			}
		}
	}
	consumer, err := natsjs.DialConsumer(ctx, srv.ClientURL(), "CONTRACTTEST", "shipping", natsjs.WithAckWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = consumer.Close() })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ib.Run(runCtx, consumer) }()
	var parked []inbox.Parked
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		parked, err = ib.ListParked(ctx, inbox.ParkedFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(parked) == 2 && applied.Load() == 1 {
			break
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if applied.Load() != 1 || len(parked) != 2 {
		t.Fatalf("applied %d, parked %d; want 1 and 2 (%+v)", applied.Load(), len(parked), parked)
	}
	byAgg := map[string]inbox.Parked{}
	for _, p := range parked {
		if p.Reason != inbox.ReasonSchema {
			t.Errorf("parked %s with reason %s, want schema", p.Event.AggregateID, p.Reason)
		}
		byAgg[p.Event.AggregateID] = p
	}
	if e := byAgg["a-2"].LastError; !strings.Contains(e, "payload violates its contract") || !strings.Contains(e, "at /qty: rule type") || strings.Contains(e, "many") {
		t.Errorf("a-2 parked with %q, want the contract violation at /qty, rule type, no payload value", e)
	}
	if e := byAgg["a-3"].LastError; !strings.Contains(e, "no contract for this schema version") {
		t.Errorf("a-3 parked with %q, want the unknown-version text", e)
	}
	// Replay with a consumer whose contract accepts it: applied.
	loose, err := inbox.New(drv, "shipping", handler)
	if err != nil {
		t.Fatal(err)
	}
	res, err := loose.Replay(ctx, byAgg["a-2"].ID)
	if err != nil || len(res) != 1 || res[0].Outcome != inbox.OutcomeApplied {
		t.Fatalf("replay: %v %+v", err, res)
	}
	if applied.Load() != 2 {
		t.Errorf("after replay applied %d, want 2", applied.Load())
	}
}

func TestConsumerContractsSQLite(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	consumerCase(t, drv, orderContracts(t))
}

// On Postgres a batch of several messages goes through the bulk pass
// (inbox/bulk.go), which checks contracts on its own path; one worker and WithBatch make
// the three published messages one batch.
func TestConsumerContractsPostgres(t *testing.T) {
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	consumerCase(t, drv, orderContracts(t))
	t.Run("batched", func(t *testing.T) {
		pg := testenv.NewPostgresSchema(t)
		drv := pgxv5.New(pg.Pool)
		if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
			t.Fatal(err)
		}
		consumerCase(t, drv, orderContracts(t), inbox.WithBatch(16, 300*time.Millisecond), inbox.WithWorkers(1))
	})
}
