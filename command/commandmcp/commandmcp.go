// Package commandmcp exposes a service's own idempotent commands
// (command.Runner) as MCP tools, so the service's agents can retry a
// command safely: the idempotency key is a required input; a call with a
// key already used by the same request returns the stored outcome and the
// ids of the events the first run wrote, without running the command
// again; a key reused with another request is a tool error naming the key.
//
// The answer of every call with one key is the same (result, event ids,
// first run time); whether this call replayed is in the result's _meta
// ("ferry/replayed"), not in the answer, so an agent comparing answers
// compares outcomes. Importing this package links the MCP SDK.
package commandmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ferryhq/ferry/command"
)

// Input is a command tool's input: the idempotency key and the request.
type Input[In any] struct {
	IdempotencyKey string `json:"idempotency_key" jsonschema:"required: a key you choose once per intended command (e.g. a UUID) and reuse on every retry of it; a retry with the same key and request returns the first outcome without running the command again; the same key with another request is refused"`
	Request        In     `json:"request" jsonschema:"the command's request"`
}

// Output is a command tool's answer, identical for every call with one key.
type Output[Out any] struct {
	IdempotencyKey string `json:"idempotency_key"`
	Result         Out    `json:"result" jsonschema:"the command's outcome as stored when it first ran"`
	// EventIDs are the events the command wrote in its transaction; pass
	// one to ferry mcp's evidence tool to see whether it was published,
	// applied and its effects done.
	EventIDs []string `json:"event_ids" jsonschema:"the events the command wrote in its transaction; verify them with ferry mcp's evidence tool"`
	// FirstRunAt is when the command ran, to the millisecond (what both
	// dialects store exactly, so a replay answers the same instant).
	FirstRunAt time.Time `json:"first_run_at" jsonschema:"when the command ran (the first call with this key), to the millisecond"`
}

// Func runs a command in tx: it writes the business rows and the events
// (outbox.InsertTx) and returns the outcome and the events' ids.
type Func[TTx, In, Out any] func(ctx context.Context, tx TTx, in In) (Out, []uuid.UUID, error)

// Tool describes one command tool.
type Tool[TTx, In, Out any] struct {
	// Name and Description are the MCP tool's; the description should say
	// what the command does and what it changes.
	Name, Description string
	// Tenant returns the tenant that scopes the key (default "").
	Tenant func(ctx context.Context, req *mcp.CallToolRequest) (string, error)
	Run    Func[TTx, In, Out]
}

// MetaReplayed is the _meta key saying whether a call replayed a stored
// outcome (true) or ran the command (false).
const MetaReplayed = "ferry/replayed"

// Add registers t on srv, run through r. The request's fingerprint is its
// JSON encoding (Go's encoding of In is deterministic: struct fields in
// order, map keys sorted), so the same request always matches.
func Add[TTx, In, Out any](srv *mcp.Server, r *command.Runner[TTx], t Tool[TTx, In, Out]) error {
	if srv == nil || r == nil || t.Run == nil {
		return errors.New("commandmcp: Add needs a server, a runner and Tool.Run")
	}
	if t.Name == "" || t.Description == "" {
		return errors.New("commandmcp: Tool.Name and Tool.Description are required")
	}
	f := false
	mcp.AddTool(srv, &mcp.Tool{Name: t.Name, Description: t.Description + " Idempotent: idempotency_key is required; retrying with the same key and request " +
		"returns the first outcome and its event ids without running again; the same key with a different request is an error naming the key.",
		Annotations: &mcp.ToolAnnotations{Title: t.Name, IdempotentHint: true, DestructiveHint: &f, OpenWorldHint: &f}},
		func(ctx context.Context, req *mcp.CallToolRequest, in Input[In]) (*mcp.CallToolResult, Output[Out], error) {
			var zero Output[Out]
			if in.IdempotencyKey == "" || len(in.IdempotencyKey) > command.MaxKeyBytes {
				return nil, zero, fmt.Errorf("idempotency_key: required, 1..%d bytes", command.MaxKeyBytes)
			}
			tenant := ""
			if t.Tenant != nil {
				var err error
				if tenant, err = t.Tenant(ctx, req); err != nil {
					return nil, zero, err
				}
			}
			body, err := json.Marshal(in.Request)
			if err != nil {
				return nil, zero, fmt.Errorf("request: %w", err)
			}
			outcome, err := r.Run(ctx, command.Request{TenantID: tenant, Key: in.IdempotencyKey, Body: body}, func(ctx context.Context, tx TTx) (command.Result, error) {
				out, ids, err := t.Run(ctx, tx, in.Request)
				if err != nil {
					return command.Result{}, err
				}
				b, err := json.Marshal(out)
				if err != nil {
					return command.Result{}, fmt.Errorf("result: %w", err)
				}
				return command.Result{Body: b, EventIDs: ids}, nil
			})
			if err != nil {
				var reused *command.KeyReusedError
				if errors.As(err, &reused) {
					return nil, zero, fmt.Errorf("idempotency_key %q was already used with a different request; nothing ran. Use a new key for a new command, or resend the original request to get its outcome", in.IdempotencyKey)
				}
				return nil, zero, err
			}
			res := Output[Out]{IdempotencyKey: in.IdempotencyKey, EventIDs: []string{}, FirstRunAt: outcome.CreatedAt.UTC().Truncate(time.Millisecond)}
			if err := json.Unmarshal(outcome.Body, &res.Result); err != nil {
				return nil, zero, fmt.Errorf("stored outcome of key %q: %w", in.IdempotencyKey, err)
			}
			for _, id := range outcome.EventIDs {
				res.EventIDs = append(res.EventIDs, id.String())
			}
			return &mcp.CallToolResult{Meta: mcp.Meta{MetaReplayed: outcome.Replayed}}, res, nil
		})
	return nil
}
