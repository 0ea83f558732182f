package effecthttp_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func intent() effect.Intent {
	ev := uuid.MustParse("01890f4e-7d1c-7cc0-8a3b-6c2f1e0b9a55")
	return effect.Intent{Consumer: "billing", EventID: ev, Step: "charge", Target: "payments", Operation: "charge",
		Request: []byte(`{"order":"o1"}`), Key: effect.Key("billing", ev, "charge"), Attempt: 1}
}

func client(t *testing.T, base string, tr *http.Transport) *effecthttp.Client {
	t.Helper()
	if tr == nil {
		tr = &http.Transport{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", strings.NewReader(string(in.Request)))
	}, effecthttp.WithHTTPClient(&http.Client{Transport: tr}), effecthttp.WithStatusURL(base+"/charges?key={key}"),
		effecthttp.WithOperationIDHeader("X-Op"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type class string

const (
	succeeded class = "succeeded"
	rejected  class = "rejected"
	notSent   class = "not_sent"
	unknown   class = "unknown"
)

func classify(err error) class {
	switch {
	case err == nil:
		return succeeded
	case errors.Is(err, effect.ErrRejected):
		return rejected
	case errors.Is(err, effect.ErrNotSent):
		return notSent
	default:
		return unknown
	}
}

func TestStatusCodeMapping(t *testing.T) {
	cases := map[int]class{
		200: succeeded, 201: succeeded, 204: succeeded,
		400: rejected, 401: rejected, 403: rejected, 404: rejected, 422: rejected,
		408: unknown, 409: unknown, 425: unknown, 429: unknown,
		500: unknown, 502: unknown, 503: unknown, 504: unknown, 302: unknown,
	}
	var code atomic.Int32
	var gotKey atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey.Store(r.Header.Get("Idempotency-Key"))
		w.Header().Set("X-Op", "op_1")
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	c := client(t, srv.URL, &http.Transport{})
	for status, want := range cases {
		code.Store(int32(status))
		res, err := c.Execute(context.Background(), intent())
		if got := classify(err); got != want {
			t.Errorf("http %d: %s (%v), want %s", status, got, err, want)
		}
		if want == succeeded && res.OperationID != "op_1" {
			t.Errorf("http %d: operation id %q, want op_1", status, res.OperationID)
		}
		if k, _ := gotKey.Load().(string); k != intent().Key {
			t.Fatalf("Idempotency-Key sent %q, want %q", k, intent().Key)
		}
	}
}

func TestConnectionRefusedIsNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := client(t, "http://"+addr, nil)
	_, err = c.Execute(context.Background(), intent())
	if classify(err) != notSent {
		t.Fatalf("refused: %v, want ErrNotSent", err)
	}
	if _, err := c.Status(context.Background(), intent()); err == nil {
		t.Fatal("status against a dead port: want an error (counted as unknown)")
	}
}

// A response dropped after the request was written is unknown, and the
// transport does not silently re-send it on its own (every retry must go
// through reconciliation) even on a reused keep-alive connection.
func TestDroppedResponseIsUnknownAndNotResent(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			return
		}
		posts.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer srv.Close()
	tr := &http.Transport{}
	c := client(t, srv.URL, tr)
	// Warm a keep-alive connection so the POST goes over a reused one: the
	// case where net/http would re-send a "replayable" request by itself.
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL + "/warm")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, err = c.Execute(context.Background(), intent())
	if classify(err) != unknown {
		t.Fatalf("dropped response: %v, want unknown", err)
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("server saw %d POSTs, want 1: the transport re-sent the request blind", n)
	}
}

func TestTimeoutAfterSendIsUnknown(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := client(t, srv.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Execute(ctx, intent()); classify(err) != unknown {
		t.Fatalf("timeout after send: %v, want unknown", err)
	}
}

func TestStatusMapping(t *testing.T) {
	var code atomic.Int32
	var query atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query.Store(r.URL.Query().Get("key"))
		w.Header().Set("X-Op", "op_9")
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	c := client(t, srv.URL, nil)
	for status, want := range map[int]effect.Lookup{200: effect.LookupFound, 404: effect.LookupNotFound, 500: effect.LookupUnknown, 429: effect.LookupUnknown} {
		code.Store(int32(status))
		st, err := c.Status(context.Background(), intent())
		if err != nil || st.Lookup != want {
			t.Errorf("status %d: %v %v, want %v", status, st.Lookup, err, want)
		}
		if want == effect.LookupFound && st.OperationID != "op_9" {
			t.Errorf("found without operation id: %+v", st)
		}
		if q, _ := query.Load().(string); q != intent().Key {
			t.Fatalf("status query key %q, want %q", q, intent().Key)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	build := func(ctx context.Context, in effect.Intent) (*http.Request, error) { return nil, nil }
	if _, err := effecthttp.New(build); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("no status query: %v, want config error", err)
	}
	if _, err := effecthttp.New(build, effecthttp.WithStatusURL("http://x/status")); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("template without {key}: %v", err)
	}
}
