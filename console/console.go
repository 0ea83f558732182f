// Package console is ferry console: an HTTP API under /api/v1 and an
// embedded web console over a Ferry database. Every page and endpoint
// calls package ops — the same functions the CLI calls — so the console
// is never a second implementation of a query or an action.
//
// Security by default: the server is meant to bind loopback (CheckListen
// refuses any other address without authentication); every /api/v1 and
// /metrics request is authenticated (package opsauth) and state changes
// are POST only, need the operator role, are refused to agents and are
// protected by http.CrossOriginProtection; responses carry a strict
// Content-Security-Policy, X-Content-Type-Options and Referrer-Policy;
// request bodies are size-limited (413); --read-only refuses every action.
// The web console renders every value with DOM textContent, never as
// markup, and payloads are hidden unless an operator reveals one, which is
// itself an audited action.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

//go:embed assets
var assetsFS embed.FS

// DefaultMaxBody bounds request bodies (413 beyond it).
const DefaultMaxBody = 64 << 10

// ErrUnsafeListen: a non-loopback address without authentication.
var ErrUnsafeListen = errors.New("console: refusing to listen on a non-loopback address without authentication")

// Config configures a Server.
type Config struct {
	// Auth authenticates every API request (required): opsauth.Tokens,
	// opsauth.ProxyHeaders or, on loopback only, opsauth.Local.
	Auth opsauth.Authenticator
	// ReadOnly refuses every action (403), previews included.
	ReadOnly bool
	// Tables are the schema and prefix of Ferry's tables (evidence lines
	// name them).
	Tables ferry.Tables
	// MaxBody bounds request bodies (default DefaultMaxBody).
	MaxBody int64
	// Logger logs requests by method, path, status and identity name —
	// never a token or a body — with the request's context, so a handler
	// can attach trace ids. Nil means slog.Default() as it is when New
	// runs, like every Ferry component; slog.New(slog.DiscardHandler)
	// silences it.
	Logger *slog.Logger
	// LoopbackHostsOnly refuses requests whose Host header is not a
	// loopback name or address (403): with opsauth.Local there is no
	// credential, so a web page on another site that resolves its own name
	// to 127.0.0.1 (DNS rebinding) must not read the console.
	LoopbackHostsOnly bool
	// Collector options for /metrics.
	CollectorOptions []ops.CollectorOption
}

// Server is the console's handler.
type Server struct {
	o       *ops.Ops
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	routes  []route
}

// New returns the console over o.
func New(o *ops.Ops, cfg Config) (*Server, error) {
	if o == nil {
		return nil, errors.New("console: ops must not be nil")
	}
	if cfg.Auth == nil {
		return nil, errors.New("console: Config.Auth is required (opsauth.Tokens, opsauth.ProxyHeaders or opsauth.Local)")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	cfg.Logger = logattr.OrDefault(cfg.Logger)
	s := &Server{o: o, cfg: cfg, log: cfg.Logger}
	s.routes = s.apiRoutes()

	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(o, cfg.CollectorOptions...), collectors.NewGoCollector())

	api := http.NewServeMux()
	for _, rt := range s.routes {
		h := rt.handler
		if rt.action {
			h = s.action(h)
		}
		api.Handle(rt.method+" "+rt.path, opsauth.Require(rt.role, h))
	}
	api.Handle("GET /metrics", opsauth.Require(opsauth.RoleViewer, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	api.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		// A path of an endpoint with another method: 405, not 404.
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			r2 := r.Clone(r.Context())
			r2.Method = m
			if _, pattern := api.Handler(r2); m != r.Method && pattern != "/api/" && pattern != "" {
				w.Header().Set("Allow", m)
				opsauth.WriteProblem(w, http.StatusMethodNotAllowed, "method not allowed", r.URL.Path+" takes "+m, "")
				return
			}
		}
		opsauth.WriteProblem(w, http.StatusNotFound, "no such endpoint", r.Method+" "+r.URL.Path+" is not part of /api/v1 (see /api/v1/openapi.json)", "")
	})

	mux := http.NewServeMux()
	authed := opsauth.Middleware(cfg.Auth, recordIdentity(api))
	mux.Handle("/api/", authed)
	mux.Handle("GET /metrics", authed)
	mux.HandleFunc("GET /api/v1/openapi.json", s.openAPI)
	mux.HandleFunc("GET /healthz", s.healthz)
	sub, err := fs.Sub(assetsFS, "assets")
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(sub)))
	index, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	for _, p := range Pages {
		pattern := "GET " + p
		if p == "/" {
			pattern = "GET /{$}"
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write(index)
		})
	}

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		opsauth.WriteProblem(w, http.StatusForbidden, "cross-origin request refused",
			"state-changing requests must come from the console's own origin (Sec-Fetch-Site / Origin checked)", "")
	}))
	s.handler = s.headers(s.checkHost(s.limitBody(cop.Handler(mux))))
	return s, nil
}

// Pages are the console's page paths; each serves the single-page app,
// which reads the path and query (so /evidence?q=<id> is a stable link).
var Pages = []string{"/", "/outbox", "/message", "/dead", "/parked", "/parked-message", "/effects", "/effect", "/evidence", "/audit", "/cleanup"}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// HTTPServer returns an http.Server for addr with timeouts set, so a slow
// or idle client cannot hold connections open.
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           s,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// CheckListen refuses a listen address that is not loopback unless
// authentication is configured: with no tokens file and no trusted proxy,
// anyone who can reach the port would act as the local operator.
func CheckListen(addr string, authConfigured bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: --listen %q: %w", addr, err)
	}
	if IsLoopback(host) || authConfigured {
		return nil
	}
	shown := host
	if shown == "" {
		shown = "all interfaces"
	}
	return fmt.Errorf("%w: --listen %s binds %s; configure --tokens-file or --proxy-user-header with --trusted-proxy, or bind 127.0.0.1", ErrUnsafeListen, addr, shown)
}

// IsLoopback reports whether host (an IP or "localhost") is loopback;
// "" (all interfaces) is not.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (s *Server) headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		info := &requestInfo{}
		next.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		who := info.identity
		// Path only: query strings may carry search terms; never headers.
		s.log.DebugContext(r.Context(), "console request", "method", r.Method, "path", r.URL.Path, "status", rw.status, "identity", who, "duration", time.Since(start))
	})
}

// requestInfo carries what inner handlers learn (the identity) out to the
// request log.
type requestInfo struct{ identity string }

type requestInfoKey struct{}

func recordIdentity(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := r.Context().Value(requestInfoKey{}).(*requestInfo); ok {
			if id, ok := opsauth.FromContext(r.Context()); ok {
				info.identity = id.Name
			}
		}
		next.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) checkHost(next http.Handler) http.Handler {
	if !s.cfg.LoopbackHostsOnly {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !IsLoopback(strings.Trim(host, "[]")) {
			opsauth.WriteProblem(w, http.StatusForbidden, "host refused", "without authentication the console answers only to a loopback Host (127.0.0.1, ::1, localhost)", "")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// FirstOf authenticates with the first authenticator that accepts the
// request (e.g. a bearer token, else the trusted proxy's headers).
type FirstOf []opsauth.Authenticator

// Authenticate implements opsauth.Authenticator.
func (f FirstOf) Authenticate(r *http.Request) (opsauth.Identity, error) {
	var errs []error
	for _, a := range f {
		id, err := a.Authenticate(r)
		if err == nil {
			return id, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return opsauth.Identity{}, fmt.Errorf("%w: no authenticator", opsauth.ErrUnauthenticated)
	}
	return opsauth.Identity{}, errors.Join(errs...)
}

func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.cfg.MaxBody {
			opsauth.WriteProblem(w, http.StatusRequestEntityTooLarge, "request body too large", fmt.Sprintf("at most %d bytes", s.cfg.MaxBody), "body")
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
		}
		next.ServeHTTP(w, r)
	})
}

// action guards a state-changing endpoint: not in read-only mode, and an
// approval only from an identity that may approve (an operator that is
// not an agent); the request body is decoded by the handler.
func (s *Server) action(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ReadOnly {
			opsauth.WriteProblem(w, http.StatusForbidden, "read-only console", "this console runs with --read-only: actions are disabled", "")
			return
		}
		id, _ := opsauth.FromContext(r.Context())
		if id.Agent {
			opsauth.WriteProblem(w, http.StatusForbidden, "agents may not act", id.Name+" is an agent identity: actions need a human operator's approval", "")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if _, err := s.o.ReplayWindow(r.Context()); err != nil && !errors.Is(err, ops.ErrNotFound) {
		s.log.WarnContext(r.Context(), "console healthz: database unreachable", logattr.Err(err))
		opsauth.WriteProblem(w, http.StatusServiceUnavailable, "database unreachable", "", "")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}

// writeError maps an ops error to a problem document naming the field.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *ops.ArgError
	var mbe *http.MaxBytesError
	var re *ops.RetentionError
	var fe *fieldError
	switch {
	case errors.As(err, &mbe):
		opsauth.WriteProblem(w, http.StatusRequestEntityTooLarge, "request body too large", fmt.Sprintf("at most %d bytes", mbe.Limit), "body")
	case errors.As(err, &fe):
		opsauth.WriteProblem(w, http.StatusBadRequest, "invalid "+fe.field, fe.reason, fe.field)
	case errors.As(err, &ae):
		opsauth.WriteProblem(w, http.StatusBadRequest, "invalid "+ae.Field, ae.Reason, ae.Field)
	case errors.Is(err, ops.ErrReasonRequired):
		opsauth.WriteProblem(w, http.StatusBadRequest, "a reason is required", "approving an action needs a reason a later reader understands", "reason")
	case errors.Is(err, ops.ErrEmptyFilter):
		opsauth.WriteProblem(w, http.StatusBadRequest, "empty filter", "give a filter, or set filter.all to act on every matching row", "filter")
	case errors.As(err, &re):
		opsauth.WriteProblem(w, http.StatusBadRequest, "retention too short", re.Error(), "retention")
	case errors.Is(err, ops.ErrNotFound):
		opsauth.WriteProblem(w, http.StatusNotFound, "not found", err.Error(), "")
	case errors.Is(err, ops.ErrUnsupported):
		opsauth.WriteProblem(w, http.StatusConflict, "not installed", err.Error(), "")
	default:
		s.log.ErrorContext(r.Context(), "console request failed", "method", r.Method, "path", r.URL.Path, logattr.Err(err))
		opsauth.WriteProblem(w, http.StatusInternalServerError, "internal error", strings.SplitN(err.Error(), "\n", 2)[0], "")
	}
}

// fieldError is a console input error (a query parameter or body field).
type fieldError struct{ field, reason string }

func (e *fieldError) Error() string { return "console: invalid " + e.field + ": " + e.reason }
