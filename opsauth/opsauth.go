// Package opsauth authenticates the people and agents who use Ferry's
// operator surfaces — the console and its HTTP API (ferry console) and the
// MCP server (ferry mcp) — and says what each may do. One identity model
// for all of them: the audit row of an action records the authenticated
// name, never a name the client typed.
//
// Identities come from one of:
//
//   - a tokens file (--tokens-file): each entry names an identity, its role,
//     whether it is an agent, and the SHA-256 of its bearer token — the
//     token itself is never stored ([LoadTokensFile], [NewToken]);
//   - a trusted reverse proxy that authenticated the user (SSO) and passes
//     the name and role in headers, accepted only from the proxy's
//     addresses ([ProxyHeaders]);
//   - the local user, for a server bound to loopback with no authentication
//     configured, or an MCP server on stdio spawned by the user's own agent
//     client ([Local]).
//
// Roles: a viewer reads (no payload reveal, no actions); an operator also
// acts, reveals payloads and approves. An identity marked agent may read
// and propose actions up to its role, but never approve or execute an
// operator action itself: a human (or a policy) approves.
package opsauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Role is what an identity may do.
type Role string

// Roles, from least to most.
const (
	// RoleViewer reads everything but payloads and acts on nothing.
	RoleViewer Role = "viewer"
	// RoleOperator also acts (retry, discard, replay, requeue, cleanup),
	// reveals payloads and approves requests.
	RoleOperator Role = "operator"
)

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	}
	return 0
}

// Valid reports whether r is a defined role.
func (r Role) Valid() bool { return r.rank() > 0 }

// Allows reports whether r includes need.
func (r Role) Allows(need Role) bool { return r.Valid() && r.rank() >= need.rank() }

// Identity is an authenticated caller.
type Identity struct {
	// Name is what audit rows record: the tokens file entry, the proxy's
	// user header, or the local OS user.
	Name string `json:"name"`
	Role Role   `json:"role"`
	// Agent marks an automated caller (an AI agent): it may propose, never
	// approve.
	Agent bool `json:"agent"`
	// Source says how the identity was established: "token", "proxy" or
	// "local".
	Source string `json:"source"`
}

// CanApprove reports whether the identity may approve or execute an
// operator action: an operator that is not an agent.
func (id Identity) CanApprove() bool { return !id.Agent && id.Role.Allows(RoleOperator) }

// Sentinel errors; handlers map them to 401 and 403.
var (
	// ErrUnauthenticated: no or unknown credentials.
	ErrUnauthenticated = errors.New("opsauth: not authenticated")
	// ErrForbidden: authenticated, but the role does not allow it.
	ErrForbidden = errors.New("opsauth: forbidden")
	// ErrInvalidTokensFile: the tokens file is malformed; the message names
	// the entry and field.
	ErrInvalidTokensFile = errors.New("opsauth: invalid tokens file")
)

// Authenticator establishes who made a request.
type Authenticator interface {
	// Authenticate returns the caller's identity, or an error wrapping
	// ErrUnauthenticated.
	Authenticate(r *http.Request) (Identity, error)
}

// Tokens is a loaded tokens file.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	id   Identity
	hash [32]byte
}

// TokensFile is the on-disk form (YAML):
//
//	tokens:
//	  - name: alice          # recorded in audit rows
//	    role: operator       # viewer | operator
//	    sha256: 5e88…        # hex SHA-256 of the bearer token (ferry tokens new prints one)
//	  - name: claude
//	    role: operator
//	    agent: true          # may propose actions, never approve them
//	    sha256: 9f86…
type TokensFile struct {
	Tokens []TokenSpec `yaml:"tokens"`
}

// TokenSpec is one identity of a tokens file.
type TokenSpec struct {
	Name   string `yaml:"name"`
	Role   Role   `yaml:"role"`
	Agent  bool   `yaml:"agent,omitempty"`
	SHA256 string `yaml:"sha256"`
}

// maxNameLen bounds identity names (they end up in audit rows).
const maxNameLen = 200

// LoadTokensFile reads and validates a tokens file.
func LoadTokensFile(path string) (*Tokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("opsauth: tokens file: %w", err)
	}
	t, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseTokens validates a tokens file's content: every entry needs a
// unique name of at most 200 printable bytes, a role, and a unique 64-hex
// SHA-256; unknown keys are refused.
func ParseTokens(b []byte) (*Tokens, error) {
	var f TokensFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTokensFile, err)
	}
	if len(f.Tokens) == 0 {
		return nil, fmt.Errorf("%w: tokens: no entries", ErrInvalidTokensFile)
	}
	t := &Tokens{}
	names, hashes := map[string]bool{}, map[string]bool{}
	for i, e := range f.Tokens {
		field := func(name, reason string) error {
			return fmt.Errorf("%w: tokens[%d].%s: %s", ErrInvalidTokensFile, i, name, reason)
		}
		if e.Name == "" || len(e.Name) > maxNameLen || strings.ContainsFunc(e.Name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, field("name", fmt.Sprintf("required, 1..%d printable bytes", maxNameLen))
		}
		if names[e.Name] {
			return nil, field("name", fmt.Sprintf("%q is given twice", e.Name))
		}
		if !e.Role.Valid() {
			return nil, field("role", fmt.Sprintf("must be viewer or operator, got %q", e.Role))
		}
		h, err := hex.DecodeString(strings.ToLower(e.SHA256))
		if err != nil || len(h) != sha256.Size {
			return nil, field("sha256", "must be the 64 hex digits of the token's SHA-256 (ferry tokens new prints one)")
		}
		if hashes[string(h)] {
			return nil, field("sha256", "the same token is given to two identities")
		}
		names[e.Name], hashes[string(h)] = true, true
		te := tokenEntry{id: Identity{Name: e.Name, Role: e.Role, Agent: e.Agent, Source: "token"}}
		copy(te.hash[:], h)
		t.entries = append(t.entries, te)
	}
	return t, nil
}

// Len is the number of identities.
func (t *Tokens) Len() int { return len(t.entries) }

// Lookup returns the identity whose token is token. It compares the
// token's hash with every entry in constant time, so timing does not tell
// which entry nearly matched.
func (t *Tokens) Lookup(token string) (Identity, bool) {
	if t == nil || token == "" {
		return Identity{}, false
	}
	h := sha256.Sum256([]byte(token))
	var found Identity
	ok := false
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(h[:], e.hash[:]) == 1 {
			found, ok = e.id, true
		}
	}
	return found, ok
}

// Authenticate reads "Authorization: Bearer <token>".
func (t *Tokens) Authenticate(r *http.Request) (Identity, error) {
	token, ok := BearerToken(r)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	id, ok := t.Lookup(token)
	if !ok {
		return Identity{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	return id, nil
}

// BearerToken returns the token of an "Authorization: Bearer" header.
func BearerToken(r *http.Request) (string, bool) {
	v := r.Header.Get("Authorization")
	const p = "bearer "
	if len(v) <= len(p) || !strings.EqualFold(v[:len(p)], p) {
		return "", false
	}
	tok := strings.TrimSpace(v[len(p):])
	return tok, tok != ""
}

// HashToken is the hex SHA-256 a tokens file stores for token.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// NewToken returns a fresh random bearer token (256 bits, base64url) and
// its hash for the tokens file.
func NewToken() (token, sha string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("opsauth: random token: %w", err)
	}
	token = "ferry_" + base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token), nil
}

// ProxyHeaders trusts a reverse proxy that has authenticated the user
// (an SSO gateway, oauth2-proxy and the like): the user's name and role come
// from request headers, accepted only when the request's peer address is
// one of Trusted. The trust model: whoever can reach the server from a
// trusted address can claim any identity, so the server must be reachable
// only through the proxy, and the proxy must strip these headers from what
// clients send.
type ProxyHeaders struct {
	// UserHeader carries the authenticated user name (e.g. X-Forwarded-User).
	UserHeader string
	// RoleHeader carries the role; when empty or absent, DefaultRole.
	RoleHeader string
	// DefaultRole applies when the proxy sends no role (default viewer).
	DefaultRole Role
	// AgentHeader, when set and "true", marks the caller an agent.
	AgentHeader string
	// Trusted are the proxies' addresses.
	Trusted []netip.Prefix
}

// Authenticate implements Authenticator.
func (p ProxyHeaders) Authenticate(r *http.Request) (Identity, error) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: peer address %q", ErrUnauthenticated, r.RemoteAddr)
	}
	trusted := false
	for _, pr := range p.Trusted {
		if pr.Contains(ap.Addr().Unmap()) {
			trusted = true
		}
	}
	if !trusted {
		return Identity{}, fmt.Errorf("%w: %s is not a trusted proxy", ErrUnauthenticated, ap.Addr())
	}
	name := strings.TrimSpace(r.Header.Get(p.UserHeader))
	if name == "" || len(name) > maxNameLen {
		return Identity{}, fmt.Errorf("%w: proxy sent no %s", ErrUnauthenticated, p.UserHeader)
	}
	role := p.DefaultRole
	if role == "" {
		role = RoleViewer
	}
	if p.RoleHeader != "" {
		if v := strings.TrimSpace(r.Header.Get(p.RoleHeader)); v != "" {
			role = Role(v)
		}
	}
	if !role.Valid() {
		return Identity{}, fmt.Errorf("%w: proxy sent role %q", ErrUnauthenticated, role)
	}
	agent := p.AgentHeader != "" && strings.EqualFold(r.Header.Get(p.AgentHeader), "true")
	return Identity{Name: name, Role: role, Agent: agent, Source: "proxy"}, nil
}

// Local authenticates every request as one local identity: for a server
// bound to loopback with no authentication configured (only the machine's
// own users can reach it) or an MCP server on stdio.
type Local struct{ Identity Identity }

// LocalUser is the local identity: $USER (else "local"), operator unless
// agent, in which case an operator agent (it proposes, never approves).
func LocalUser(agent bool) Local {
	name := os.Getenv("USER")
	if name == "" {
		name = "local"
	}
	return Local{Identity: Identity{Name: name, Role: RoleOperator, Agent: agent, Source: "local"}}
}

// Authenticate implements Authenticator.
func (l Local) Authenticate(*http.Request) (Identity, error) { return l.Identity, nil }

type ctxKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity Middleware stored.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// Middleware authenticates every request with a and stores the identity in
// its context; unauthenticated requests get 401 (application/problem+json,
// WWW-Authenticate: Bearer) and never reach next.
func Middleware(a Authenticator, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.Authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
			WriteProblem(w, http.StatusUnauthorized, "not authenticated", "send Authorization: Bearer <token> from the tokens file", "")
			return
		}
		next.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

// Require returns 403 unless the request's identity has role need.
func Require(need Role, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := FromContext(r.Context())
		if !ok {
			WriteProblem(w, http.StatusUnauthorized, "not authenticated", "", "")
			return
		}
		if !id.Role.Allows(need) {
			WriteProblem(w, http.StatusForbidden, "forbidden", fmt.Sprintf("%s has role %s; this needs %s", id.Name, id.Role, need), "")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteProblem writes an RFC 9457 problem document; field, when set, names
// the offending input.
func WriteProblem(w http.ResponseWriter, status int, title, detail, field string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: "about:blank", Title: title, Status: status, Detail: detail, Field: field})
}

// Problem is an RFC 9457 problem document, with the offending input named
// in Field.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty"`
}
