package opsauth

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func tokensFile(t *testing.T, entries ...TokenSpec) *Tokens {
	t.Helper()
	var b strings.Builder
	b.WriteString("tokens:\n")
	for _, e := range entries {
		b.WriteString("  - name: " + e.Name + "\n    role: " + string(e.Role) + "\n    sha256: " + e.SHA256 + "\n")
		if e.Agent {
			b.WriteString("    agent: true\n")
		}
	}
	path := filepath.Join(t.TempDir(), "tokens.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokensFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTokensAuthenticate(t *testing.T) {
	op, opHash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	ag, agHash, _ := NewToken()
	if !strings.HasPrefix(op, "ferry_") || HashToken(op) != opHash || op == ag {
		t.Fatalf("NewToken: %q %q", op, opHash)
	}
	tk := tokensFile(t, TokenSpec{Name: "alice", Role: RoleOperator, SHA256: opHash}, TokenSpec{Name: "claude", Role: RoleOperator, Agent: true, SHA256: agHash})
	h := Middleware(tk, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := FromContext(r.Context())
		_ = json.NewEncoder(w).Encode(id)
	}))
	call := func(auth string) (*httptest.ResponseRecorder, Identity) {
		r := httptest.NewRequest("GET", "/api/v1/status", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var id Identity
		_ = json.Unmarshal(w.Body.Bytes(), &id)
		return w, id
	}
	if w, id := call("Bearer " + op); w.Code != 200 || id.Name != "alice" || id.Role != RoleOperator || id.Agent || !id.CanApprove() {
		t.Fatalf("operator: %d %+v", w.Code, id)
	}
	if w, id := call("bearer " + ag); w.Code != 200 || id.Name != "claude" || !id.Agent || id.CanApprove() {
		t.Fatalf("agent: %d %+v (an agent must never approve)", w.Code, id)
	}
	for _, bad := range []string{"", "Bearer ", "Bearer nope", "Basic " + op, op} {
		w, _ := call(bad)
		if w.Code != http.StatusUnauthorized || !strings.Contains(w.Header().Get("Content-Type"), "problem+json") || w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d %v", bad, w.Code, w.Header())
		}
	}
}

func TestParseTokensNamesTheField(t *testing.T) {
	good := HashToken("x")
	for want, src := range map[string]string{
		"tokens: no entries":    "tokens: []\n",
		"tokens[0].name":        "tokens:\n  - role: viewer\n    sha256: " + good + "\n",
		"tokens[0].role":        "tokens:\n  - name: a\n    role: admin\n    sha256: " + good + "\n",
		"tokens[0].sha256":      "tokens:\n  - name: a\n    role: viewer\n    sha256: abc\n",
		"tokens[1].name":        "tokens:\n  - name: a\n    role: viewer\n    sha256: " + good + "\n  - name: a\n    role: viewer\n    sha256: " + HashToken("y") + "\n",
		"same token":            "tokens:\n  - name: a\n    role: viewer\n    sha256: " + good + "\n  - name: b\n    role: viewer\n    sha256: " + good + "\n",
		"field token not found": "tokens:\n  - name: a\n    role: viewer\n    token: secret\n    sha256: " + good + "\n",
		"cannot unmarshal":      "tokens: 5\n",
	} {
		_, err := ParseTokens([]byte(src))
		if !errors.Is(err, ErrInvalidTokensFile) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want %q", src, err, want)
		}
	}
}

func TestRequireRole(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	for _, c := range []struct {
		id   Identity
		need Role
		code int
	}{
		{Identity{Name: "v", Role: RoleViewer}, RoleViewer, 204},
		{Identity{Name: "v", Role: RoleViewer}, RoleOperator, 403},
		{Identity{Name: "o", Role: RoleOperator}, RoleOperator, 204},
		{Identity{Name: "x", Role: "root"}, RoleViewer, 403},
	} {
		h := Middleware(Local{Identity: c.id}, Require(c.need, ok))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/", nil))
		if w.Code != c.code {
			t.Errorf("%+v needs %s: %d, want %d", c.id, c.need, w.Code, c.code)
		}
	}
	w := httptest.NewRecorder()
	Require(RoleViewer, ok).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 401 {
		t.Errorf("no identity: %d", w.Code)
	}
}

func TestProxyHeadersTrustOnlyTheProxy(t *testing.T) {
	p := ProxyHeaders{UserHeader: "X-Forwarded-User", RoleHeader: "X-Ferry-Role", Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}}
	req := func(remote, user, role string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		if user != "" {
			r.Header.Set("X-Forwarded-User", user)
		}
		if role != "" {
			r.Header.Set("X-Ferry-Role", role)
		}
		return r
	}
	if id, err := p.Authenticate(req("10.0.0.5:4000", "bob", "")); err != nil || id.Name != "bob" || id.Role != RoleViewer || id.Source != "proxy" {
		t.Fatalf("trusted proxy: %+v %v", id, err)
	}
	if id, err := p.Authenticate(req("10.0.0.5:4000", "bob", "operator")); err != nil || id.Role != RoleOperator {
		t.Fatalf("role header: %+v %v", id, err)
	}
	for name, r := range map[string]*http.Request{
		"untrusted peer": req("10.0.0.6:4000", "bob", "operator"),
		"no user":        req("10.0.0.5:4000", "", ""),
		"bad role":       req("10.0.0.5:4000", "bob", "root"),
		"bad peer":       req("pipe", "bob", ""),
	} {
		if _, err := p.Authenticate(r); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
