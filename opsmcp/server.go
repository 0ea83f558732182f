// Package opsmcp is Ferry's Model Context Protocol server (ferry mcp): it
// gives an AI agent authoritative evidence from Ferry's tables — what was
// committed, published, applied and charged, each fact with its source —
// and lets it propose operator actions, never approve them.
//
// Tools read through package ops (the same functions the CLI calls) and
// declare JSON input and output schemas. Actions go through a plan:
// preview_action returns the exact rows and a plan hash; request_action
// records a pending request under the caller's authenticated identity; a
// human approves it (ferry approvals approve), which executes exactly the
// previewed plan and only while the rows are unchanged. A policy file may
// auto-approve named low-risk actions within limits.
//
// Transports: stdio (the agent client spawns ferry mcp; the identity is
// the local user, marked agent) and streamable HTTP (bearer tokens from
// an opsauth tokens file; loopback without a tokens file serves the local
// user as an agent). Importing this package links the MCP SDK; the rest of
// Ferry does not.
package opsmcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

// Config configures a Server.
type Config struct {
	// Ops reads the tables and runs approved plans. Required.
	Ops *ops.Ops
	// Tables names the tables in evidence sources (the same as Ops's).
	Tables ferry.Tables
	// Policy auto-approves named low-risk actions; nil approves nothing.
	Policy *ops.Policy
	// Guarantees and Runbooks are the markdown served as the resources
	// ferry://guarantees and ferry://runbooks/… (package docs embeds them).
	Guarantees string
	Runbooks   string
	// Version is reported to clients.
	Version string
	// Logger logs actions requested through MCP by ids and counts, never
	// a token or a payload. Nil means slog.Default() as it is when New
	// runs, like every Ferry component; slog.New(slog.DiscardHandler)
	// silences it.
	Logger *slog.Logger
	// PlanTTL is how long a preview's plan can be requested (default 1h).
	PlanTTL time.Duration
}

// Server is one MCP server over one database. It is safe for concurrent
// sessions.
type Server struct {
	cfg   Config
	plans *planCache
	log   *slog.Logger
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Ops == nil {
		return nil, errors.New("opsmcp: Config.Ops is required")
	}
	if cfg.PlanTTL == 0 {
		cfg.PlanTTL = time.Hour
	}
	if cfg.PlanTTL < 0 {
		return nil, fmt.Errorf("opsmcp: Config.PlanTTL must be positive, got %s", cfg.PlanTTL)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := logattr.OrDefault(cfg.Logger)
	return &Server{cfg: cfg, plans: &planCache{ttl: cfg.PlanTTL, m: map[string]cachedPlan{}}, log: log}, nil
}

// identityKey is the TokenInfo.Extra key holding the opsauth.Identity.
const identityKey = "ferry.identity"

// MCP returns an MCP server with Ferry's tools and resources. fixed is the
// identity of every call that carries no token (stdio, loopback without a
// tokens file); nil means every call must carry a bearer token.
func (s *Server) MCP(fixed *opsauth.Identity) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "ferry", Title: "Ferry outbox/inbox evidence and operator proposals", Version: s.cfg.Version},
		&mcp.ServerOptions{Instructions: instructions})
	who := func(req *mcp.CallToolRequest) (opsauth.Identity, error) {
		if req != nil && req.Extra != nil && req.Extra.TokenInfo != nil {
			if id, ok := req.Extra.TokenInfo.Extra[identityKey].(opsauth.Identity); ok {
				return id, nil
			}
		}
		if fixed != nil {
			return *fixed, nil
		}
		return opsauth.Identity{}, fmt.Errorf("%w: no identity on this call", opsauth.ErrUnauthenticated)
	}
	s.addTools(srv, who)
	s.addResources(srv)
	return srv
}

const instructions = `Ferry keeps the evidence of a transactional outbox/inbox pipeline in database tables.
Use evidence to verify a claim ("sent", "charged", "done") instead of asserting it: every fact names its
source row, and a stage the tables cannot show is "unknown", never guessed. Operator actions are proposals:
preview_action returns the exact rows and a plan_hash; request_action(plan_hash, reason) records a pending
request under your authenticated identity; a human approves it (you cannot), and approval runs exactly the
previewed rows only if they are unchanged. Read ferry://guarantees for what Ferry does and does not promise.`

// ServeStdio serves one session on stdin/stdout as id (normally
// opsauth.LocalUser(true).Identity) until the client disconnects or ctx
// ends.
func (s *Server) ServeStdio(ctx context.Context, id opsauth.Identity) error {
	return s.MCP(&id).Run(ctx, &mcp.StdioTransport{})
}

// HTTPHandler serves the streamable HTTP transport. With tokens, every
// request needs "Authorization: Bearer <token>" (401 otherwise) and each
// call runs as the token's identity; a session is bound to the identity
// that opened it. With tokens nil, every call runs as local (for a
// loopback listener only; ferry mcp refuses other addresses).
func (s *Server) HTTPHandler(tokens *opsauth.Tokens, local *opsauth.Identity) (http.Handler, error) {
	if tokens == nil && local == nil {
		return nil, errors.New("opsmcp: HTTPHandler needs tokens or a local identity")
	}
	if tokens == nil {
		srv := s.MCP(local)
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil), nil
	}
	srv := s.MCP(nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		id, ok := tokens.Lookup(token)
		if !ok {
			return nil, fmt.Errorf("%w: unknown token", auth.ErrInvalidToken)
		}
		// Tokens do not expire; the file is the revocation list. The
		// expiration only satisfies the SDK's check, per request.
		return &auth.TokenInfo{UserID: id.Name, Expiration: time.Now().Add(time.Hour), Extra: map[string]any{identityKey: id}}, nil
	}
	return auth.RequireBearerToken(verify, nil)(h), nil
}

// planCache keeps previewed plans by hash so request_action can name one
// by its hash alone. Bounded in size and age.
type planCache struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[string]cachedPlan
}

type cachedPlan struct {
	plan ops.Plan
	at   time.Time
}

const maxCachedPlans = 1000

func (c *planCache) put(p ops.Plan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for h, e := range c.m {
		if now.Sub(e.at) > c.ttl {
			delete(c.m, h)
		}
	}
	if len(c.m) >= maxCachedPlans {
		var oldest string
		var at time.Time
		for h, e := range c.m {
			if oldest == "" || e.at.Before(at) {
				oldest, at = h, e.at
			}
		}
		delete(c.m, oldest)
	}
	c.m[p.Hash] = cachedPlan{plan: p, at: now}
}

func (c *planCache) get(hash string) (ops.Plan, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	if !ok || time.Since(e.at) > c.ttl {
		return ops.Plan{}, false
	}
	return e.plan, true
}

// Resources.

var headingRE = regexp.MustCompile(`(?m)^## (.+)$`)

// Runbook is one "## " section of the runbooks markdown.
type Runbook struct {
	Slug, Title, Text string
}

// Runbooks splits markdown into its "## " sections.
func Runbooks(md string) []Runbook {
	locs := headingRE.FindAllStringSubmatchIndex(md, -1)
	var out []Runbook
	for i, l := range locs {
		end := len(md)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		title := strings.TrimSpace(md[l[2]:l[3]])
		out = append(out, Runbook{Slug: slug(title), Title: title, Text: strings.TrimSpace(md[l[0]:end]) + "\n"})
	}
	return out
}

func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func (s *Server) addResources(srv *mcp.Server) {
	text := func(uri, body string) mcp.ResourceHandler {
		return func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/markdown", Text: body}}}, nil
		}
	}
	if s.cfg.Guarantees != "" {
		srv.AddResource(&mcp.Resource{URI: "ferry://guarantees", Name: "guarantees", Title: "What Ferry guarantees (G1-G5) and what it never claims",
			Description: "The guarantee table: each guarantee, when it holds, the mechanism and the test that proves it. Read it before concluding anything from evidence.",
			MIMEType:    "text/markdown"}, text("ferry://guarantees", s.cfg.Guarantees))
	}
	if s.cfg.Runbooks != "" {
		srv.AddResource(&mcp.Resource{URI: "ferry://runbooks", Name: "runbooks", Title: "Operations runbooks (docs/OPERATIONS.md)",
			Description: "Every runbook: dead letters, parked messages, gaps, unknown and failed effects, replay, cleanup, evidence.",
			MIMEType:    "text/markdown"}, text("ferry://runbooks", s.cfg.Runbooks))
		for _, rb := range Runbooks(s.cfg.Runbooks) {
			uri := "ferry://runbooks/" + rb.Slug
			srv.AddResource(&mcp.Resource{URI: uri, Name: "runbook-" + rb.Slug, Title: "Runbook: " + rb.Title, MIMEType: "text/markdown",
				Description: "The " + rb.Title + " section of docs/OPERATIONS.md."}, text(uri, rb.Text))
		}
	}
}
