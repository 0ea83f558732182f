package opsmcp_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/command/commandmcp"
	"github.com/ferryhq/ferry/examples/orders"
	"github.com/ferryhq/ferry/opsmcp"
	"github.com/ferryhq/ferry/relay"
)

// TestStdioEvidence drives `ferry mcp` as a subprocess over stdio with the
// SDK's own client. An order placed through the example service's
// place_order tool is committed, published twice (the first relay crashes
// after the broker's ack, before its mark; the second re-publishes and the
// broker answers "duplicate"), applied once by billing and charged once;
// evidence reports exactly that, every fact with its source. A command
// that rolled back reports not committed; an event the relay has not
// marked reports published unknown, as do the consumer stages the tables
// cannot show. Every output validates against its declared schema.
func TestStdioEvidence(t *testing.T) {
	bin := ferryBinary(t)
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "orders.db")
	svc, err := orders.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	log := slog.New(slog.DiscardHandler)

	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: orders.Stream, Subjects: []string{orders.Topic}}); err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	// The application's own agent tool, in process.
	app := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	if err := svc.AddTools(app); err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := app.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	acs, err := newClient().Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = acs.Close() })
	appTools := listTools(t, acs)
	placed, res := call[commandmcp.Output[orders.OrderPlaced]](t, acs, appTools, "place_order",
		map[string]any{"idempotency_key": "order-1", "request": map[string]any{"customer": "c-1", "sku": "book", "amount_cents": 4200}})
	if res.IsError || len(placed.EventIDs) != 1 {
		t.Fatalf("place_order: %s %+v", errText(res), placed)
	}
	eventID := placed.EventIDs[0]
	// A command that fails rolls back: no order, no event, no key.
	_, res = call[commandmcp.Output[orders.OrderPlaced]](t, acs, appTools, "place_order",
		map[string]any{"idempotency_key": "order-bad", "request": map[string]any{"customer": "c-2", "sku": "book", "amount_cents": 0}})
	if !res.IsError || !strings.Contains(errText(res), "amount_cents") {
		t.Fatalf("invalid order: %v %s", res.IsError, errText(res))
	}

	// Relay 1 publishes, the broker acks, and it crashes before marking.
	var once sync.Once
	crashed := false
	r1, err := relay.New(svc.Driver, pub, relay.WithPollInterval(20*time.Millisecond), relay.WithLogger(log), relay.WithRegisterer(prometheus.NewRegistry()),
		relay.WithFaults(relay.Faults{AfterPublishBeforeMark: func(_ context.Context, _ []ferry.Event, res []broker.Result) error {
			var err error
			once.Do(func() {
				if len(res) == 1 && res[0].Err == nil {
					crashed, err = true, errors.New("simulated crash after the ack, before the mark")
				}
			})
			return err
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Run(ctx); !errors.Is(err, relay.ErrFaultInjected) || !crashed {
		t.Fatalf("relay 1: %v (crashed %v), want the injected crash", err, crashed)
	}
	r2, err := relay.New(svc.Driver, pub, relay.WithPollInterval(20*time.Millisecond), relay.WithLogger(log), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- r2.Run(rctx) }()

	provider := orders.NewProvider()
	bctx, stopBilling := context.WithCancel(ctx)
	bdone := make(chan error, 1)
	go func() { bdone <- svc.RunBilling(bctx, nc, provider, log) }()
	t.Cleanup(func() {
		stopBilling()
		if err := <-bdone; err != nil {
			t.Errorf("billing: %v", err)
		}
	})
	var charged, sent int
	waitFor(t, "published, applied and charged", func() bool {
		_ = svc.DB.QueryRow(`SELECT count(*) FROM ferry_effects WHERE state = 'succeeded'`).Scan(&charged)
		_ = svc.DB.QueryRow(`SELECT count(*) FROM ferry_outbox WHERE status = 'sent'`).Scan(&sent)
		return charged == 1 && sent == 1 && provider.Charges() == 1
	})
	stopRelay()
	if err := <-rdone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay 2: %v", err)
	}
	// An order the relay has not published yet (it is stopped).
	pending, res := call[commandmcp.Output[orders.OrderPlaced]](t, acs, appTools, "place_order",
		map[string]any{"idempotency_key": "order-2", "request": map[string]any{"customer": "c-3", "sku": "pen", "amount_cents": 100}})
	if res.IsError {
		t.Fatal(errText(res))
	}

	// The agent's view, through ferry mcp on stdio.
	cmd := exec.Command(bin, "mcp", "--database-url", "sqlite:"+dbPath)
	cmd.Stderr = io.Discard
	cs, err := newClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	tools := listTools(t, cs)
	for _, name := range opsmcp.ToolNames {
		if tools[name] == nil {
			t.Fatalf("tool %s not listed (have %v)", name, keys(tools))
		}
	}
	for name := range tools {
		if strings.Contains(name, "approve") {
			t.Fatalf("an agent-facing server lists %s: agents never approve", name)
		}
	}

	ev, res := call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"event_id": eventID})
	if res.IsError || !ev.Found || len(ev.Events) != 1 {
		t.Fatalf("evidence: %s %+v", errText(res), ev)
	}
	e := ev.Events[0]
	expect := func(stage string, s opsmcp.Stage, verdict string, count int, sourceHas ...string) {
		t.Helper()
		if s.Verdict != verdict || s.Count != count {
			t.Fatalf("%s: verdict %q count %d, want %q %d; facts %+v", stage, s.Verdict, s.Count, verdict, count, s.Facts)
		}
		for _, f := range s.Facts {
			if f.Source == "" || f.Fact == "" {
				t.Fatalf("%s: a fact without a source: %+v", stage, f)
			}
		}
		for _, want := range sourceHas {
			if !slices.ContainsFunc(s.Facts, func(f opsmcp.Fact) bool { return strings.Contains(f.Source, want) }) {
				t.Fatalf("%s: no fact sourced from %q: %+v", stage, want, s.Facts)
			}
		}
	}
	expect("committed", e.Committed, opsmcp.VerdictCommitted, 1, "ferry_outbox id=")
	expect("published", e.Published, opsmcp.VerdictPublished, 2, "duplicate=true", "ferry_outbox id=")
	expect("applied_by", e.AppliedBy, opsmcp.VerdictApplied, 1, `ferry_inbox (consumer="billing"`)
	expect("effects", e.Effects, opsmcp.VerdictSucceeded, 1, "ferry_effects idem_key=")

	// The same story by command key and by aggregate.
	byKey, _ := call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"command_key": "order-1"})
	if byKey.Command == nil || byKey.Command.Verdict != opsmcp.VerdictCommitted || len(byKey.Events) != 1 || byKey.Events[0].EventID != eventID ||
		!strings.Contains(byKey.Command.Facts[0].Source, "ferry_command_keys") {
		t.Fatalf("evidence by command key: %+v", byKey)
	}
	byAgg, _ := call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"aggregate_type": "order", "aggregate_id": placed.Result.OrderID})
	if len(byAgg.Events) != 1 || byAgg.Events[0].Published.Count != 2 {
		t.Fatalf("evidence by aggregate: %+v", byAgg)
	}

	// The rolled-back command.
	bad, res := call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"command_key": "order-bad"})
	if res.IsError || bad.Found || bad.Command == nil || bad.Command.Verdict != opsmcp.VerdictNotCommitted ||
		!strings.Contains(bad.Command.Facts[0].Source, `idem_key="order-bad": no row`) {
		t.Fatalf("rolled-back command: %s %+v", errText(res), bad)
	}

	// The unpublished order: what the tables cannot show is unknown.
	pe, _ := call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"event_id": pending.EventIDs[0]})
	if len(pe.Events) != 1 {
		t.Fatalf("pending evidence: %+v", pe)
	}
	p := pe.Events[0]
	expect("pending committed", p.Committed, opsmcp.VerdictCommitted, 1)
	expect("pending published", p.Published, opsmcp.VerdictUnknown, 0, "status=pending")
	expect("pending applied_by", p.AppliedBy, opsmcp.VerdictUnknown, 0)
	expect("pending effects", p.Effects, opsmcp.VerdictUnknown, 0)

	// Bad input names the field.
	_, res = call[opsmcp.EvidenceOut](t, cs, tools, "evidence", map[string]any{"event_id": eventID, "command_key": "order-1"})
	if !res.IsError || !strings.Contains(errText(res), "exactly one") {
		t.Fatalf("two selectors: %v %s", res.IsError, errText(res))
	}

	// The other read tools answer within their schemas.
	for name, args := range map[string]map[string]any{
		"whoami": {}, "status": {}, "find_events": {"aggregate_type": "order", "aggregate_id": placed.Result.OrderID},
		"list_dead": {}, "list_parked": {"consumer": "billing"}, "list_effects": {}, "list_approvals": {},
		"preview_action": {"action": "cleanup", "retention": "168h"},
	} {
		if _, res := call[map[string]any](t, cs, tools, name, args); res.IsError {
			t.Fatalf("%s: %s", name, errText(res))
		}
	}
	who, _ := call[opsmcp.WhoamiOut](t, cs, tools, "whoami", map[string]any{})
	if !who.Identity.Agent || who.CanApprove || who.Identity.Source != "local" {
		t.Fatalf("stdio identity %+v: want the local user marked agent, unable to approve", who)
	}
	// Resources: the guarantee table and the runbooks.
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "ferry://guarantees"})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, "G5") {
		t.Fatalf("guarantees resource: %v %+v", err, rr)
	}
	rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "ferry://runbooks/dead-letter"})
	if err != nil || !strings.HasPrefix(rr.Contents[0].Text, "## Dead letter") {
		t.Fatalf("dead-letter runbook: %v %+v", err, rr)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
