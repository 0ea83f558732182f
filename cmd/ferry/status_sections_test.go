package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/testenv"
)

// scrapeStatusMetrics runs `ferry status --metrics-addr` on a free port,
// scrapes /metrics once and stops the command.
func scrapeStatusMetrics(t *testing.T, url string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := runCLIContext(ctx, "status", "--database-url", url, "--metrics-addr", addr)
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("status --metrics-addr: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr != nil {
				t.Fatal(rerr)
			}
			return string(body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics endpoint never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// `ferry status` over a missing table: the table output says which
// section failed and why, --json carries the section and both exit
// non-zero, and the metrics endpoint exports ferry_ops_up 0 and
// ferry_ops_section_up{section="inbox"} 0 instead of "nothing parked".
// Then the relay section, which must not just vanish.
func TestStatusCLIMissingTable(t *testing.T) {
	for name, url := range map[string]string{
		"sqlite":   "sqlite:" + filepath.Join(t.TempDir(), "status.db"),
		"postgres": testenv.NewPostgresSchema(t).URL,
		"mysql":    testenv.NewMySQLDatabase(t).URL,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
			s, err := openStore(ctx, url, ferry.Tables{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			db := []string{"--database-url", url}
			if out, err := runCLI(t, append([]string{"status"}, db...)...); err != nil || strings.Contains(out, "FAILED") {
				t.Fatalf("healthy status: %v\n%s", err, out)
			}
			if m := scrapeStatusMetrics(t, url); !strings.Contains(m, "\nferry_ops_up 1\n") || !strings.Contains(m, `ferry_ops_section_up{section="inbox"} 1`) {
				t.Fatalf("healthy metrics:\n%s", m)
			}

			if _, err := s.Executor().Exec(ctx, `DROP TABLE ferry_inbox_parked`); err != nil {
				t.Fatal(err)
			}
			out, err := runCLI(t, append([]string{"status"}, db...)...)
			if err == nil {
				t.Fatalf("status exits 0 with ferry_inbox_parked missing:\n%s", out)
			}
			for _, want := range []string{
				"FAILED  inbox: table ferry_inbox_parked missing (migration 0003_inbox is recorded as applied); its numbers are unknown, not zero",
				"CONSUMERS  unknown (section failed)",
				"OUTBOX  pending 0",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("status output lacks %q:\n%s", want, out)
				}
			}
			if !strings.Contains(err.Error(), "section inbox failed") {
				t.Errorf("status error: %v", err)
			}

			out, err = runCLI(t, append([]string{"status", "--json"}, db...)...)
			if err == nil {
				t.Fatalf("status --json exits 0 with ferry_inbox_parked missing:\n%s", out)
			}
			var st struct {
				Sections []struct {
					Name, State, Error string
					Missing            []string `json:"missing_tables"`
				}
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status --json: %v\n%s", err, out)
			}
			got := map[string]string{}
			for _, sec := range st.Sections {
				got[sec.Name] = sec.State
				if sec.Name == "inbox" && (fmt.Sprint(sec.Missing) != "[ferry_inbox_parked]" || !strings.Contains(sec.Error, "ferry_inbox_parked")) {
					t.Errorf("inbox section %+v", sec)
				}
			}
			if got["inbox"] != "failed" || got["outbox"] != "ok" || got["relay"] != "ok" {
				t.Fatalf("sections %v\n%s", got, out)
			}

			m := scrapeStatusMetrics(t, url)
			if !strings.Contains(m, "\nferry_ops_up 0\n") || !strings.Contains(m, `ferry_ops_section_up{section="inbox"} 0`) ||
				strings.Contains(m, "ferry_ops_inbox_") {
				t.Fatalf("metrics with ferry_inbox_parked missing:\n%s", m)
			}

			if _, err := s.Executor().Exec(ctx, `DROP TABLE ferry_relay_instances`); err != nil {
				t.Fatal(err)
			}
			out, err = runCLI(t, append([]string{"status"}, db...)...)
			if err == nil || !strings.Contains(out, "FAILED  relay: table ferry_relay_instances missing") || !strings.Contains(out, "RELAYS  unknown (section failed)") {
				t.Fatalf("status with ferry_relay_instances missing: %v\n%s", err, out)
			}
			if m := scrapeStatusMetrics(t, url); !strings.Contains(m, `ferry_ops_section_up{section="relay"} 0`) || strings.Contains(m, "ferry_ops_relay_live_instances") {
				t.Fatalf("metrics with ferry_relay_instances missing:\n%s", m)
			}
		})
	}
}
