// Package effecthttp is a ready [effect.Executor] and [effect.Reconciler]
// for HTTP APIs that honour an Idempotency-Key header (Stripe, Adyen, most
// payment and messaging APIs).
//
// [Client.Execute] sends the request built by the caller's [RequestFunc]
// with the intent's key in the Idempotency-Key header and maps what happened
// onto the ledger's states:
//
//	2xx                                   succeeded (operation id from the
//	                                      configured header or extractor)
//	4xx except 408, 409, 425, 429         failed: definite refusal (effect.ErrRejected)
//	408, 409, 425, 429, 5xx, 1xx, 3xx     unknown: reconcile before any retry
//	timeout / reset after a connection    unknown
//	was obtained
//	dial error, connection refused,       not sent: safe retry (effect.ErrNotSent)
//	timeout before any connection
//
// "Not sent" is claimed only when no connection was ever obtained for the
// request (observed with net/http/httptrace), because a request whose bytes
// may have left the process may have been applied.
//
// # No transport-level re-send
//
// net/http's HTTP/1 Transport re-sends a request by itself when a reused
// keep-alive connection dies before the response, if it considers the
// request replayable: a GET/HEAD/OPTIONS/TRACE, or any request carrying an
// "Idempotency-Key" or "X-Idempotency-Key" header under that canonical map
// key. Such a re-send skips the status query, so a provider that ignores
// or loses keys charges twice. effecthttp therefore sets the key under a
// lower-case header map key (the wire is case-insensitive; HTTP/2 lower-
// cases names anyway): the Transport does not see the charge as replayable,
// never re-sends it, and the dropped call comes back as unknown, to be
// reconciled by a status query before any new attempt with the same key.
// TestDroppedChargeNeverResentByTransport pins this with the effect worker
// and a provider that ignores keys and drops every connection after reading
// the charge; its negative control puts the key back under the canonical
// name and sees the transport charge twice. Status queries are GETs, which
// the Transport may re-send: harmless, they change nothing. Over HTTP/2
// (TLS servers that negotiate h2) Go's transport re-sends, whatever the
// headers, only when the connection was unusable before the request went
// out, on GOAWAY or REFUSED_STREAM, or after a PROTOCOL_ERROR stream reset
// from the server; the last does not prove the server did nothing, and is
// not covered by a test here.
//
// [Client.Status] reconciles: it sends a GET to the status URL (a template
// with {key}, e.g. "https://api.example/payments?idempotency_key={key}") and
// maps 2xx → found, 404 → not found, anything else (other 4xx included) →
// unknown. The operation id of a found intent is taken from the status
// response with the same [WithOperationIDHeader] or [WithOperationID] as an
// execution's (an extractor error leaves it empty). A 404 is trusted to
// mean "never applied" and leads to a new attempt with the same key: the
// status endpoint must not answer 404 for anything else.
//
// # Worker behaviour around these calls (package effect)
//
//   - The per-target circuit breaker holds status queries too: while it is
//     open, unknown intents wait (no status query, nothing spent) until the
//     next probe time, and a status query may itself be the half-open probe.
//   - For the breaker, a status answer "found" or "not found" counts as the
//     provider being up; "unknown" (a transport error, 5xx, 429, any other
//     status) counts as a failure. An execution's 2xx and definite 4xx
//     count as up; not sent and unknown count as failures. A 401/403 thus
//     counts as "up" on an execution but as a failure on a status query.
//
// # Default HTTP client
//
// Without [WithHTTPClient], a Client uses &http.Client{} with no Timeout of
// its own (the worker's call timeout bounds each call through ctx) over
// http.DefaultTransport: the process-wide shared transport, with
// keep-alives on (at most 2 idle connections per host, 100 in all, closed
// after 90s idle), TCP keep-alive probes every 30s, a 30s dial timeout, a
// 10s TLS handshake timeout, HTTP/2 when the server offers it, and proxies
// from HTTP_PROXY/HTTPS_PROXY/NO_PROXY. Being shared, it is also changed by
// whatever else in the process configures http.DefaultTransport. A charge
// sent on an idle connection the server has just closed is re-dialled by
// the transport only if not a byte of it was written (safe); once written,
// it fails after a connection was obtained and is unknown (a status query
// follows). Pass your own client to set other limits.
//
// Response bodies are read (up to a limit) only to extract the operation id;
// they are never logged or stored. The summary stored in the ledger is the
// status line and the operation id.
//
// Other protocols (SMTP, gRPC) implement the two small interfaces of package
// effect directly; this package is an example of the mapping as much as a
// tool.
package effecthttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/effect"
)

// HeaderIdempotencyKey is the header carrying the intent's key.
const HeaderIdempotencyKey = "Idempotency-Key"

// RequestFunc builds the HTTP request for an intent (typically a POST whose
// body is in.Request). It must not set Idempotency-Key: the client does.
type RequestFunc func(ctx context.Context, in effect.Intent) (*http.Request, error)

// OperationIDFunc extracts the outside system's operation id from a 2xx
// response (e.g. the "id" field of a JSON body).
type OperationIDFunc func(status int, h http.Header, body []byte) (string, error)

// Client is an Executor and Reconciler over HTTP.
type Client struct {
	build    RequestFunc
	status   RequestFunc
	http     *http.Client
	opID     OperationIDFunc
	maxBody  int64
	keyHdr   string
	template string
}

var (
	_ effect.Executor   = (*Client)(nil)
	_ effect.Reconciler = (*Client)(nil)
)

type config struct {
	http     *http.Client
	status   RequestFunc
	template string
	opID     OperationIDFunc
	opHeader string
	maxBody  int64
	keyHdr   string
}

// Option configures a Client.
type Option func(*config)

// WithHTTPClient sets the HTTP client (default: &http.Client{} over
// http.DefaultTransport, no timeout of its own; the worker's call timeout
// bounds each call; see the package doc).
func WithHTTPClient(c *http.Client) Option { return func(cfg *config) { cfg.http = c } }

// WithStatusURL sets the reconciliation GET as a URL template; "{key}" is
// replaced by the query-escaped idempotency key.
func WithStatusURL(template string) Option { return func(c *config) { c.template = template } }

// WithStatusRequest builds the reconciliation request in code, for APIs
// whose lookup is not a plain GET. 2xx → found, 404 → not found.
func WithStatusRequest(f RequestFunc) Option { return func(c *config) { c.status = f } }

// WithOperationIDHeader takes the operation id from a response header, of
// an execution's 2xx and of a status query's 2xx ("found") alike.
func WithOperationIDHeader(name string) Option { return func(c *config) { c.opHeader = name } }

// WithOperationID takes the operation id from the response with f (it wins
// over WithOperationIDHeader), for executions and status queries alike.
func WithOperationID(f OperationIDFunc) Option { return func(c *config) { c.opID = f } }

// WithMaxBody bounds how much of a response body is read (default 64 KiB).
func WithMaxBody(n int64) Option { return func(c *config) { c.maxBody = n } }

// WithKeyHeader renames the idempotency header (default "Idempotency-Key";
// some APIs want "X-Idempotency-Key" or "Idempotency-Token").
func WithKeyHeader(name string) Option { return func(c *config) { c.keyHdr = name } }

// New returns a Client that executes intents with build. A status URL or
// status request is required: without reconciliation an unknown outcome
// could never be resolved.
func New(build RequestFunc, opts ...Option) (*Client, error) {
	cfg := config{maxBody: 64 << 10, keyHdr: HeaderIdempotencyKey}
	for _, o := range opts {
		o(&cfg)
	}
	if build == nil {
		return nil, &ferry.ConfigError{Field: "effecthttp.request", Reason: "a RequestFunc is required"}
	}
	if cfg.status == nil && cfg.template == "" {
		return nil, &ferry.ConfigError{Field: "effecthttp.status", Reason: "WithStatusURL or WithStatusRequest is required: unknown outcomes must be reconciled"}
	}
	if cfg.template != "" && !strings.Contains(cfg.template, "{key}") {
		return nil, &ferry.ConfigError{Field: "effecthttp.status_url", Reason: "template must contain {key}"}
	}
	if cfg.maxBody < 0 || cfg.maxBody > 16<<20 {
		return nil, &ferry.ConfigError{Field: "effecthttp.max_body", Reason: fmt.Sprintf("must be in 0..16MiB, got %d", cfg.maxBody)}
	}
	if cfg.keyHdr == "" {
		return nil, &ferry.ConfigError{Field: "effecthttp.key_header", Reason: "must not be empty"}
	}
	if cfg.http == nil {
		cfg.http = &http.Client{}
	}
	c := &Client{build: build, status: cfg.status, http: cfg.http, opID: cfg.opID, maxBody: cfg.maxBody, keyHdr: cfg.keyHdr, template: cfg.template}
	if c.opID == nil && cfg.opHeader != "" {
		h := cfg.opHeader
		c.opID = func(_ int, hd http.Header, _ []byte) (string, error) { return hd.Get(h), nil }
	}
	return c, nil
}

// StatusError is an HTTP status that was not 2xx.
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("http %d %s", e.Code, http.StatusText(e.Code))
}

// Execute sends the intent. See the package doc for the mapping.
func (c *Client) Execute(ctx context.Context, in effect.Intent) (effect.Result, error) {
	req, err := c.build(ctx, in)
	if err != nil {
		// Nothing left the process; but a request that cannot be built
		// will not build on retry either.
		return effect.Result{}, effect.Rejected(fmt.Errorf("effecthttp: build request: %w", err))
	}
	setKey(req.Header, c.keyHdr, in.Key)
	status, h, body, err := c.do(req)
	if err != nil {
		return effect.Result{}, err
	}
	summary := fmt.Sprintf("http %d", status)
	switch {
	case status >= 200 && status < 300:
		var id string
		if c.opID != nil {
			if id, err = c.opID(status, h, body); err != nil {
				// Applied, but we cannot say under which id: still succeeded.
				summary += "; operation id not extracted: " + err.Error()
			}
		}
		if id != "" {
			summary += " op=" + id
		}
		return effect.Result{OperationID: id, Summary: summary}, nil
	case status >= 400 && status < 500 && status != 408 && status != 409 && status != 425 && status != 429:
		return effect.Result{Summary: summary}, effect.Rejected(&StatusError{Code: status})
	default:
		return effect.Result{Summary: summary}, &StatusError{Code: status} // unknown
	}
}

// Status reconciles the intent. See the package doc for the mapping.
func (c *Client) Status(ctx context.Context, in effect.Intent) (effect.Status, error) {
	var req *http.Request
	var err error
	if c.status != nil {
		req, err = c.status(ctx, in)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, strings.ReplaceAll(c.template, "{key}", url.QueryEscape(in.Key)), nil)
	}
	if err != nil {
		return effect.Status{}, fmt.Errorf("effecthttp: build status request: %w", err)
	}
	setKey(req.Header, c.keyHdr, in.Key)
	status, h, body, err := c.do(req)
	if err != nil {
		return effect.Status{}, err
	}
	summary := fmt.Sprintf("status query: http %d", status)
	switch {
	case status >= 200 && status < 300:
		var id string
		if c.opID != nil {
			id, _ = c.opID(status, h, body)
		}
		if id != "" {
			summary += " op=" + id
		}
		return effect.Status{Lookup: effect.LookupFound, OperationID: id, Summary: summary}, nil
	case status == http.StatusNotFound:
		return effect.Status{Lookup: effect.LookupNotFound, Summary: summary}, nil
	default:
		return effect.Status{Lookup: effect.LookupUnknown, Summary: summary}, nil
	}
}

// do sends req and classifies transport errors: NotSent when no connection
// was ever obtained, plain (unknown) otherwise.
func (c *Client) do(req *http.Request) (int, http.Header, []byte, error) {
	var gotConn atomic.Bool
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) }}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := c.http.Do(req)
	if err != nil {
		// A dial error after a connection was obtained (the transport
		// retrying on a fresh connection) may follow a request already
		// written: only "never connected" is "not sent".
		if !gotConn.Load() {
			return 0, nil, nil, effect.NotSent(fmt.Errorf("effecthttp: %s %s: %w", req.Method, req.URL.Redacted(), err))
		}
		return 0, nil, nil, fmt.Errorf("effecthttp: %s %s: outcome unknown: %w", req.Method, req.URL.Redacted(), err)
	}
	defer resp.Body.Close()
	// A status line arrived, so the outcome is known even if the body is
	// cut short: extraction gets what was read.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, c.maxBody))
	return resp.StatusCode, resp.Header, body, nil
}

// setKey sets the idempotency header under a lower-case map key. HTTP header
// names are case-insensitive on the wire (and lower case in HTTP/2), but
// net/http's transport looks up the canonical "Idempotency-Key" to decide
// that a POST is replayable and then silently re-sends it after a dropped
// connection. Every retry must instead go through the ledger, after a status
// query, so the transport must not see the request as replayable.
func setKey(h http.Header, name, key string) {
	h.Del(name)
	h[strings.ToLower(name)] = []string{key}
}
