package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/opsauth"
)

func TestConsoleRefusesUnsafeStart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "c.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", "sqlite:"+db); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(bad, []byte("tokens:\n  - name: a\n    role: admin\n    sha256: "+opsauth.HashToken("x")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0"}, "refusing to listen on a non-loopback address without authentication: --listen 0.0.0.0:0 binds 0.0.0.0; configure --tokens-file or --proxy-user-header with --trusted-proxy, or bind 127.0.0.1"},
		{[]string{"--listen", ":0"}, "binds all interfaces"},
		{[]string{"--trusted-proxy", "10.0.0.1"}, "--proxy-user-header and --trusted-proxy go together"},
		{[]string{"--proxy-user-header", "X-User", "--trusted-proxy", "nope"}, `--trusted-proxy "nope": not an address or CIDR`},
		{[]string{"--tokens-file", bad}, "tokens[0].role: must be viewer or operator"},
	} {
		_, err := runCLI(t, append([]string{"console", "--database-url", "sqlite:" + db}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// ferry console with a tokens file on a non-loopback-capable address:
// serves the API to a token holder, 401 without, and stops on cancel.
func TestConsoleServes(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "c.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", "sqlite:"+db); err != nil {
		t.Fatal(err)
	}
	tok, sha, err := opsauth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tf, []byte("tokens:\n  - name: ops-alice\n    role: operator\n    sha256: "+sha+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := runCLIContext(ctx, "console", "--database-url", "sqlite:"+db, "--listen", addr, "--tokens-file", tf)
		done <- err
	}()
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/api/v1/me", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := get(tok)
		if code == 200 {
			if !strings.Contains(body, `"name":"ops-alice"`) || !strings.Contains(body, `"can_act":true`) {
				t.Fatalf("me: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("console did not answer: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := get(""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("console: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("console did not stop")
	}
	http.DefaultClient.CloseIdleConnections()
}
