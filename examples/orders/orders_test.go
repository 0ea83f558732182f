package orders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/command/commandmcp"
	"github.com/ferryhq/ferry/examples/orders"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// TestAgentRetriesWhileRelayIsKilled: an agent calls place_order five
// times with one idempotency key while the relay (a `ferry relay`
// process) is SIGKILLed once and restarted: one order row, one event, one
// effect, one charge at the provider, and five identical answers (only the
// _meta says which call ran the command). The same key with another
// request is a tool error naming the key.
func TestAgentRetriesWhileRelayIsKilled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "ferry")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/ferryhq/ferry/cmd/ferry").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dbPath := filepath.Join(dir, "orders.db")
	svc, err := orders.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	emb, err := natsembed.Start(natsembed.WithStoreDir(filepath.Join(dir, "nats")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: orders.Stream, Subjects: []string{orders.Topic}}); err != nil {
		t.Fatal(err)
	}
	startRelay := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(bin, "relay", "--database-url", "sqlite:"+dbPath, "--broker-url", emb.ClientURL(), "--stream", orders.Stream,
			"--subjects", orders.Topic, "--listen", "", "--poll-interval", "20ms", "--lease-ttl", "1s", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	relayProc := startRelay()
	t.Cleanup(func() {
		if relayProc != nil {
			_ = relayProc.Process.Kill()
			_ = relayProc.Wait()
		}
	})

	provider := orders.NewProvider()
	bctx, stopBilling := context.WithCancel(ctx)
	bdone := make(chan error, 1)
	go func() { bdone <- svc.RunBilling(bctx, nc, provider, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		stopBilling()
		if err := <-bdone; err != nil {
			t.Errorf("billing: %v", err)
		}
	})

	srv := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	if err := svc.AddTools(srv); err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	lt, err := cs.ListTools(ctx, nil)
	if err != nil || len(lt.Tools) != 1 {
		t.Fatalf("tools: %v %+v", err, lt)
	}
	schema, _ := json.Marshal(lt.Tools[0].InputSchema)
	if !strings.Contains(string(schema), `"required":["idempotency_key","request"]`) {
		t.Fatalf("place_order input schema does not require the idempotency key: %s", schema)
	}
	args := map[string]any{"idempotency_key": "agent-7f3", "request": map[string]any{"customer": "c-9", "sku": "lamp", "amount_cents": 12900}}
	var answers [][]byte
	for i := range 5 {
		switch i {
		case 1:
			// SIGKILL the relay while the event may be anywhere between
			// claim, publish and mark; the next one takes the shards over
			// once the lease expires.
			if err := relayProc.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = relayProc.Wait()
			relayProc = nil
		case 3:
			relayProc = startRelay()
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "place_order", Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %+v", i+1, err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		answers = append(answers, b)
		if replayed, _ := res.Meta[commandmcp.MetaReplayed].(bool); replayed != (i > 0) {
			t.Fatalf("call %d: replayed %v", i+1, replayed)
		}
	}
	for i, a := range answers {
		if !bytes.Equal(a, answers[0]) {
			t.Fatalf("answer %d differs:\n%s\n%s", i+1, a, answers[0])
		}
	}
	var out commandmcp.Output[orders.OrderPlaced]
	if err := json.Unmarshal(answers[0], &out); err != nil || len(out.EventIDs) != 1 || out.Result.OrderID == "" {
		t.Fatalf("answer %s: %v", answers[0], err)
	}

	count := func(q string) int {
		var n int
		if err := svc.DB.QueryRow(q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for count(`SELECT count(*) FROM ferry_outbox WHERE status = 'sent'`) != 1 || count(`SELECT count(*) FROM ferry_effects WHERE state = 'succeeded'`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the order was not published and charged within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // room for a second delivery to do harm, if any could
	for q, want := range map[string]int{
		`SELECT count(*) FROM orders`:        1,
		`SELECT count(*) FROM ferry_outbox`:  1,
		`SELECT count(*) FROM ferry_inbox`:   1,
		`SELECT count(*) FROM ferry_effects`: 1,
	} {
		if got := count(q); got != want {
			t.Fatalf("%s = %d, want %d", q, got, want)
		}
	}
	if n := provider.Charges(); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}

	// The same key with another request: refused, naming the key; nothing ran.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "place_order",
		Arguments: map[string]any{"idempotency_key": "agent-7f3", "request": map[string]any{"customer": "c-9", "sku": "lamp", "amount_cents": 99}}})
	if err != nil || !res.IsError || !strings.Contains(fmt.Sprint(res.Content[0].(*mcp.TextContent).Text), `"agent-7f3"`) {
		t.Fatalf("reused key: %v %+v", err, res)
	}
	// A missing key is refused by the schema before anything runs.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "place_order", Arguments: map[string]any{"request": args["request"]}})
	if err != nil || !res.IsError {
		t.Fatalf("no key: %v %+v", err, res)
	}
	if got := count(`SELECT count(*) FROM orders`); got != 1 {
		t.Fatalf("orders after refused calls: %d", got)
	}
}

// TestControlWithoutRunner: the same five calls to a tool that runs the
// command without the runner (no stored outcome) place five orders and
// write five events — what the key prevents.
func TestControlWithoutRunner(t *testing.T) {
	ctx := context.Background()
	svc, err := orders.Open(ctx, filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	srv := mcp.NewServer(&mcp.Implementation{Name: "naive", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "place_order_naive", Description: "no idempotency"},
		func(ctx context.Context, _ *mcp.CallToolRequest, in orders.PlaceOrder) (*mcp.CallToolResult, orders.OrderPlaced, error) {
			tx, err := svc.DB.BeginTx(ctx, nil)
			if err != nil {
				return nil, orders.OrderPlaced{}, err
			}
			defer func() { _ = tx.Rollback() }()
			out, _, err := svc.Place(ctx, tx, in)
			if err != nil {
				return nil, out, err
			}
			return nil, out, tx.Commit()
		})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	for range 5 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "place_order_naive", Arguments: map[string]any{"customer": "c-9", "sku": "lamp", "amount_cents": 12900}})
		if err != nil || res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
	}
	n, err := svc.Orders(ctx)
	if err != nil || n != 5 {
		t.Fatalf("control: %d orders (%v), want 5: without the runner every retry is a new order", n, err)
	}
}
