package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/docs"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
	"github.com/ferryhq/ferry/opsmcp"
)

func newMCPCmd() *cobra.Command {
	var f storeFlags
	var mask maskFlag
	var listen, tokensFile, policyFile string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "MCP server for agents: evidence from the tables, previews, and proposals a human approves",
		Long: `mcp serves the Model Context Protocol so an AI agent can verify what
happened instead of asserting it, and propose — never approve — operator
actions.

Tools: whoami, status, evidence, find_events, list_dead, list_parked,
list_effects, preview_action, request_action, list_approvals. Resources: the
guarantee table (ferry://guarantees) and the runbooks (ferry://runbooks/…).
See docs/AGENTS.md.

Without --listen it serves one session on stdin/stdout (an agent client
spawns it) as the local user, marked agent. With --listen it serves
streamable HTTP at /mcp: --tokens-file makes every request carry a bearer
token (401 otherwise) whose identity the audit rows record; without a tokens
file only a loopback address is allowed and every caller is the local user,
marked agent. Agents never approve: ferry approvals approve does, run by a
human. --policy-file auto-approves named low-risk actions within limits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var tokens *opsauth.Tokens
			if tokensFile != "" {
				t, err := opsauth.LoadTokensFile(tokensFile)
				if err != nil {
					return fmt.Errorf("--tokens-file: %w", err)
				}
				tokens = t
			}
			if listen != "" {
				host, _, err := net.SplitHostPort(listen)
				if err != nil {
					return fmt.Errorf("--listen %q: %w", listen, err)
				}
				if tokens == nil && !console.IsLoopback(host) {
					return fmt.Errorf("--listen %s is not a loopback address: pass --tokens-file so every caller needs a bearer token, or bind 127.0.0.1", listen)
				}
			} else if tokens != nil {
				return errors.New("--tokens-file applies to --listen (HTTP); on stdio the caller is the local user who spawned ferry mcp")
			}
			var policy *ops.Policy
			if policyFile != "" {
				p, err := ops.LoadPolicy(policyFile)
				if err != nil {
					return fmt.Errorf("--policy-file: %w", err)
				}
				policy = p
			}
			s, err := f.open(ctx, cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			masks, err := mask.options()
			if err != nil {
				return err
			}
			// stdout carries the protocol on stdio: logs go to stderr.
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			o, err := ops.New(s, append(masks, ops.WithTables(f.tables()), ops.WithLogger(logger))...)
			if err != nil {
				return err
			}
			srv, err := opsmcp.New(opsmcp.Config{Ops: o, Tables: f.tables(), Policy: policy, Guarantees: docs.Guarantees, Runbooks: docs.Operations,
				Version: cmd.Root().Version, Logger: logger})
			if err != nil {
				return err
			}
			local := opsauth.LocalUser(true).Identity
			if listen == "" {
				err := srv.ServeStdio(ctx, local)
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			}
			var h http.Handler
			if tokens != nil {
				h, err = srv.HTTPHandler(tokens, nil)
			} else {
				h, err = srv.HTTPHandler(nil, &local)
			}
			if err != nil {
				return err
			}
			mux := http.NewServeMux()
			mux.Handle("/mcp", h)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 32 << 10,
				ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
			fmt.Fprintf(cmd.ErrOrStderr(), "ferry mcp on http://%s/mcp\n", ln.Addr())
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
			<-errc
			return nil
		},
	}
	f.register(cmd)
	mask.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "", `serve streamable HTTP at http://ADDR/mcp (e.g. 127.0.0.1:8090) instead of stdio; a non-loopback address requires --tokens-file`)
	fl.StringVar(&tokensFile, "tokens-file", "", "YAML tokens file (the console's): name, role (viewer|operator), agent, sha256 of the bearer token")
	fl.StringVar(&policyFile, "policy-file", "", "YAML policy: rules that auto-approve named low-risk actions up to max_rows (see docs/AGENTS.md)")
	return cmd
}
