// Package orders is an example service wired for agents: an agent places an
// order through an MCP tool (command/commandmcp) with an idempotency key;
// the command writes the order row and an order.placed event in one
// transaction (outbox); a relay (ferry relay, or relay.New in process)
// publishes it to NATS JetStream; the billing consumer applies it once
// through its inbox and records a charge in the effect ledger; the effect
// worker charges the payment provider once, with the ledger's key.
//
// An agent that retries place_order with the same key gets the same answer
// and causes nothing new; it verifies the result with ferry mcp's evidence
// tool (event id from the answer) instead of claiming it.
//
// cmd/orders runs it all in one process on SQLite with an embedded NATS
// and serves the MCP tools on stdio.
package orders

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/command"
	"github.com/ferryhq/ferry/command/commandmcp"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// Topic is where order events go; Stream is the JetStream stream that
// captures it.
const (
	Topic    = "order.events"
	Stream   = "ORDERS"
	Consumer = "billing"
)

// Service is the order service over one SQLite database.
type Service struct {
	DB     *sql.DB
	Driver *databasesql.Driver
	runner *command.Runner[*sql.Tx]
	outbox *outbox.Writer[*sql.Tx]
}

// Open opens (creating) the SQLite database at path, installs Ferry's
// tables and the orders table.
func Open(ctx context.Context, path string) (*Service, error) {
	db, err := sqlite.Open(path)
	if err != nil {
		return nil, err
	}
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		_ = db.Close()
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, sku TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		_ = db.Close()
		return nil, err
	}
	r, err := command.New(drv)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	w, err := outbox.New(drv) // topic {aggregate_type}.events: order.events
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &Service{DB: db, Driver: drv, runner: r, outbox: w}, nil
}

// Close closes the database.
func (s *Service) Close() error { return s.DB.Close() }

// PlaceOrder is the place_order request.
type PlaceOrder struct {
	Customer    string `json:"customer" jsonschema:"customer id"`
	SKU         string `json:"sku" jsonschema:"product"`
	AmountCents int64  `json:"amount_cents" jsonschema:"amount to charge, in cents, 1..10000000"`
}

// OrderPlaced is its outcome.
type OrderPlaced struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// Place is the command: the order row and its event, in tx.
func (s *Service) Place(ctx context.Context, tx *sql.Tx, in PlaceOrder) (OrderPlaced, []uuid.UUID, error) {
	if in.Customer == "" || in.SKU == "" {
		return OrderPlaced{}, nil, errors.New("request.customer and request.sku are required")
	}
	if in.AmountCents < 1 || in.AmountCents > 10_000_000 {
		return OrderPlaced{}, nil, fmt.Errorf("request.amount_cents must be in 1..10000000, got %d", in.AmountCents)
	}
	id := uuid.Must(uuid.NewV7()).String()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer, sku, amount_cents) VALUES ($1, $2, $3, $4)`, id, in.Customer, in.SKU, in.AmountCents); err != nil {
		return OrderPlaced{}, nil, fmt.Errorf("insert order: %w", err)
	}
	out := OrderPlaced{OrderID: id, Customer: in.Customer, AmountCents: in.AmountCents}
	evs, err := s.outbox.InsertTx(ctx, tx, ferry.Event{TenantID: "shop", AggregateType: "order", AggregateID: id, EventType: "order.placed", SchemaVersion: 1,
		Payload: fmt.Appendf(nil, `{"order_id":%q,"amount_cents":%d}`, id, in.AmountCents),
		Headers: ferry.Headers{Principal: in.Customer, Action: "order.place", Target: "order/" + id}})
	if err != nil {
		return OrderPlaced{}, nil, err
	}
	return out, []uuid.UUID{evs[0].ID}, nil
}

// AddTools registers place_order on srv.
func (s *Service) AddTools(srv *mcp.Server) error {
	return commandmcp.Add(srv, s.runner, commandmcp.Tool[*sql.Tx, PlaceOrder, OrderPlaced]{
		Name: "place_order",
		Description: "Place an order: writes the order and an order.placed event in one transaction; billing charges the amount once " +
			"after the event is published. The answer carries the order id and the event id; verify publication, application and the " +
			"charge with ferry mcp's evidence tool (event_id).",
		Run: s.Place,
	})
}

// Orders counts the order rows.
func (s *Service) Orders(ctx context.Context) (int, error) {
	var n int
	err := s.DB.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	return n, err
}

// Provider is the payment provider stand-in: idempotent by key, as real
// providers are, and keeping its own books of charges.
type Provider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key → charge id
	calls   int
}

// NewProvider returns an empty provider.
func NewProvider() *Provider { return &Provider{charges: map[string]string{}} }

// Execute charges once per key.
func (p *Provider) Execute(_ context.Context, in effect.Intent) (effect.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	id, ok := p.charges[in.Key]
	if !ok {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[in.Key] = id
	}
	return effect.Result{OperationID: id, Summary: "charged"}, nil
}

// Status answers a status query by key.
func (p *Provider) Status(_ context.Context, in effect.Intent) (effect.Status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[in.Key]; ok {
		return effect.Status{Lookup: effect.LookupFound, OperationID: id}, nil
	}
	return effect.Status{Lookup: effect.LookupNotFound}, nil
}

// Charges is how many distinct charges the provider made.
func (p *Provider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// RunBilling runs the billing consumer (inbox → effect ledger) and the
// effect worker against p until ctx ends. The stream must exist.
func (s *Service) RunBilling(ctx context.Context, nc *nats.Conn, p *Provider, log *slog.Logger) error {
	ledger, err := effect.NewLedger(s.Driver)
	if err != nil {
		return err
	}
	w, err := effect.NewWorker(ledger, effect.ExecutorFunc(p.Execute), effect.ReconcilerFunc(p.Status),
		effect.WithPollInterval(20*time.Millisecond), effect.WithLogger(log))
	if err != nil {
		return err
	}
	handler := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
		_, err := ledger.RecordTx(ctx, tx, effect.Intent{Consumer: Consumer, EventID: ev.ID, Step: "charge", TenantID: ev.TenantID,
			Target: "payments", Operation: "charge", Request: ev.Payload})
		return err
	}
	ib, err := inbox.New(s.Driver, Consumer, inbox.Handler[*sql.Tx](handler), inbox.WithLogger(log))
	if err != nil {
		return err
	}
	cons, err := natsjs.NewConsumer(ctx, nc, Stream, Consumer)
	if err != nil {
		return err
	}
	defer func() { _ = cons.Close() }()
	errc := make(chan error, 2)
	go func() { errc <- ib.Run(ctx, cons) }()
	go func() { errc <- w.Run(ctx) }()
	var first error
	for range 2 {
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) && first == nil {
			first = err
		}
	}
	return first
}
