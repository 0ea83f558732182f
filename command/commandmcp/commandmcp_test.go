package commandmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/command"
	"github.com/ferryhq/ferry/command/commandmcp"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

type transfer struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Cents int64  `json:"cents"`
}

type transferred struct {
	ID string `json:"transfer_id"`
}

// TestCommandToolOnPostgres: the key is required by the input schema; three
// calls with one key run the command once (one outbox row) and answer
// byte-identically, Postgres' microsecond timestamps included; the same key
// with another request is a tool error naming the key.
func TestCommandToolOnPostgres(t *testing.T) {
	ctx := context.Background()
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	r, err := command.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	srv := mcp.NewServer(&mcp.Implementation{Name: "bank", Version: "1"}, nil)
	if err := commandmcp.Add(srv, r, commandmcp.Tool[pgx.Tx, transfer, transferred]{Name: "transfer", Description: "Move money.",
		Run: func(ctx context.Context, tx pgx.Tx, in transfer) (transferred, []uuid.UUID, error) {
			runs++
			id := uuid.Must(uuid.NewV7()).String()
			evs, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "t", AggregateType: "transfer", AggregateID: id, EventType: "transfer.made", SchemaVersion: 1, Payload: []byte(`{}`)})
			if err != nil {
				return transferred{}, nil, err
			}
			return transferred{ID: id}, []uuid.UUID{evs[0].ID}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ss.Close() }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	req := map[string]any{"from": "a", "to": "b", "cents": 500}
	var first []byte
	for i := range 3 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer", Arguments: map[string]any{"idempotency_key": "tx-1", "request": req}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %+v", i, err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if i == 0 {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Fatalf("answer %d differs:\n%s\n%s", i, b, first)
		}
	}
	var n int
	if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_outbox`).Scan(&n); err != nil || n != 1 || runs != 1 {
		t.Fatalf("outbox rows %d, runs %d (%v), want 1 and 1", n, runs, err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer", Arguments: map[string]any{"idempotency_key": "tx-1", "request": map[string]any{"from": "a", "to": "b", "cents": 501}}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `"tx-1"`) {
		t.Fatalf("reused key: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer", Arguments: map[string]any{"request": req}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "idempotency_key") {
		t.Fatalf("missing key: %v %+v", err, res)
	}
	if runs != 1 {
		t.Fatalf("runs %d after refused calls", runs)
	}
}
