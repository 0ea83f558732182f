package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/outbox"
)

// TestMaskFlag: --mask is on ferry console, ferry mcp and the operator
// commands; a bad file is refused before anything is served, naming the
// flag, the event type and the path; FERRY_MASK works like the flag.
func TestMaskFlag(t *testing.T) {
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "m.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", db); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`order.created: ["$.customer..email"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{"--mask", bad, `"order.created"`, `"$.customer..email"`}
	for _, args := range [][]string{
		{"console", "--listen", "127.0.0.1:0"},
		{"mcp"},
		{"status"},
		{"evidence", "00000000-0000-0000-0000-000000000001"},
		{"dlq", "list"},
	} {
		_, err := runCLI(t, append(args, "--database-url", db, "--mask", bad)...)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Fatalf("%v with a bad mask: %v, want it to name %s", args, err, w)
			}
		}
	}
	t.Setenv("FERRY_MASK", filepath.Join(dir, "missing.yaml"))
	if _, err := runCLI(t, "status", "--database-url", db); err == nil || !strings.Contains(err.Error(), "--mask") {
		t.Fatalf("FERRY_MASK with a missing file: %v", err)
	}
}

// TestConsoleMaskFlag: ferry console --mask FILE serves reveals through
// the mask: a masked field's canary is not in the reveal response, the
// other fields are; ferry status and ferry evidence with the same flag
// run and show no canary. Control: the canary is in the outbox row.
func TestConsoleMaskFlag(t *testing.T) {
	const canary = "CANARY-email-7f3a@x"
	dir := t.TempDir()
	url := "sqlite:" + filepath.Join(dir, "c.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := openStore(ctx, url, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := outbox.New(s.sql)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1,
		Payload: []byte(`{"customer":{"email":"` + canary + `","name":"visible-name"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := evs[0].ID.String()
	var stored []byte
	rows, err := s.Executor().Query(ctx, `SELECT payload FROM ferry_outbox WHERE event_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		if err := rows.Scan(&stored); err != nil {
			t.Fatal(err)
		}
	}
	rows.Close()
	if !bytes.Contains(stored, []byte(canary)) {
		t.Fatalf("control: the row does not hold the canary: %s", stored)
	}
	maskFile := filepath.Join(dir, "mask.yaml")
	if err := os.WriteFile(maskFile, []byte("order.created: [\"$.customer.email\"]\n"), 0o600); err != nil {
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
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := runCLIContext(cctx, "console", "--database-url", url, "--listen", addr, "--tokens-file", tf, "--mask", maskFile)
		done <- err
	}()
	reveal := func() (int, string) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/outbox/"+id+"/reveal", strings.NewReader(`{"reason":"ticket 5"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for {
		var code int
		code, body = reveal()
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("console did not answer: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var r struct {
		PayloadText string   `json:"payload_text"`
		Masked      []string `json:"masked"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || strings.Contains(body, canary) || !strings.Contains(r.PayloadText, "visible-name") ||
		!strings.Contains(r.PayloadText, `"email":"***"`) || len(r.Masked) != 1 {
		t.Fatalf("reveal through ferry console --mask: %s %v", body, err)
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
	for _, args := range [][]string{{"status", "--json"}, {"evidence", id, "--json"}} {
		out, err := runCLI(t, append(args, "--database-url", url, "--mask", maskFile)...)
		if err != nil || !json.Valid([]byte(out)) || strings.Contains(out, canary) {
			t.Fatalf("%v --mask: %v\n%s", args, err, out)
		}
	}
}
