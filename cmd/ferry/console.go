package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/opsauth"
)

func newConsoleCmd() *cobra.Command {
	var f storeFlags
	var mask maskFlag
	var listen, tokensFile, userHeader, roleHeader, agentHeader, defaultRole string
	var trusted []string
	var readOnly bool
	var maxBody int64
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Web console and HTTP API (/api/v1) over a Ferry database: backlog, dead letters, parked, effects, evidence, audit",
		Long: `console serves the operator console and its JSON API (/api/v1, OpenAPI
document at /api/v1/openapi.json), /metrics and /healthz. Pages and API call
the same ops functions as the CLI; every action previews first and acts only
when approved with a reason, writing the same audit rows as the CLI, with
the authenticated identity as the actor.

Authentication: --tokens-file (bearer tokens; entries hold the SHA-256 of
each token, its name and role viewer|operator), and/or a trusted reverse
proxy (--proxy-user-header with --trusted-proxy). Without either the console
serves the local user as operator and only on a loopback address: binding
any other address without authentication is refused. See docs/CONSOLE.md.`,
		Example: `  ferry console --database-url postgres://localhost/app
  ferry console --database-url sqlite:app.db --listen 127.0.0.1:9090 --read-only
  ferry console --listen 0.0.0.0:8080 --tokens-file /etc/ferry/tokens.yaml
  ferry console --listen 10.0.0.5:8080 --proxy-user-header X-Forwarded-User \
      --proxy-role-header X-Ferry-Role --trusted-proxy 10.0.0.2/32`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			auth, configured, err := consoleAuth(tokensFile, userHeader, roleHeader, agentHeader, defaultRole, trusted)
			if err != nil {
				return err
			}
			if err := console.CheckListen(listen, configured); err != nil {
				return err
			}
			masks, err := mask.options()
			if err != nil {
				return err
			}
			s, err := f.open(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			o, err := ops.New(s, append(masks, ops.WithTables(f.tables()), ops.WithLogger(logger))...)
			if err != nil {
				return err
			}
			srv, err := console.New(o, console.Config{Auth: auth, ReadOnly: readOnly, Tables: f.tables(), MaxBody: maxBody,
				Logger: logger, LoopbackHostsOnly: !configured})
			if err != nil {
				return err
			}
			return serveConsole(cmd.Context(), srv, listen, logger, cmd)
		},
	}
	f.register(cmd)
	mask.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on; a non-loopback address requires --tokens-file or a trusted proxy")
	fl.StringVar(&tokensFile, "tokens-file", "", "YAML tokens file: name, role (viewer|operator), agent, sha256 of the bearer token")
	fl.StringVar(&userHeader, "proxy-user-header", "", "header carrying the user a trusted reverse proxy authenticated (e.g. X-Forwarded-User)")
	fl.StringVar(&roleHeader, "proxy-role-header", "", "header carrying the user's role (viewer|operator); absent: --proxy-default-role")
	fl.StringVar(&agentHeader, "proxy-agent-header", "", "header that, when \"true\", marks the caller an agent (may not act)")
	fl.StringVar(&defaultRole, "proxy-default-role", "viewer", "role of a proxy-authenticated user when the proxy sends none")
	fl.StringSliceVar(&trusted, "trusted-proxy", nil, "address or CIDR of the reverse proxy whose headers are trusted (repeatable)")
	fl.BoolVar(&readOnly, "read-only", false, "disable every action (retry, discard, replay, requeue, payload reveal)")
	fl.Int64Var(&maxBody, "max-body", console.DefaultMaxBody, "largest request body in bytes (larger: 413)")
	return cmd
}

// consoleAuth builds the authenticator from the flags; configured is false
// when only the local user applies.
func consoleAuth(tokensFile, userHeader, roleHeader, agentHeader, defaultRole string, trusted []string) (opsauth.Authenticator, bool, error) {
	var auths console.FirstOf
	if tokensFile != "" {
		t, err := opsauth.LoadTokensFile(tokensFile)
		if err != nil {
			return nil, false, fmt.Errorf("--tokens-file: %w", err)
		}
		auths = append(auths, t)
	}
	if userHeader != "" || len(trusted) > 0 {
		if userHeader == "" || len(trusted) == 0 {
			return nil, false, errors.New("--proxy-user-header and --trusted-proxy go together: the proxy's headers are trusted only from its addresses")
		}
		p := opsauth.ProxyHeaders{UserHeader: userHeader, RoleHeader: roleHeader, AgentHeader: agentHeader, DefaultRole: opsauth.Role(defaultRole)}
		if !p.DefaultRole.Valid() {
			return nil, false, fmt.Errorf("--proxy-default-role: must be viewer or operator, got %q", defaultRole)
		}
		for _, tr := range trusted {
			pr, err := netip.ParsePrefix(tr)
			if err != nil {
				a, aerr := netip.ParseAddr(tr)
				if aerr != nil {
					return nil, false, fmt.Errorf("--trusted-proxy %q: not an address or CIDR", tr)
				}
				pr = netip.PrefixFrom(a, a.BitLen())
			}
			p.Trusted = append(p.Trusted, pr)
		}
		auths = append(auths, p)
	}
	if len(auths) == 0 {
		return opsauth.LocalUser(false), false, nil
	}
	return auths, true, nil
}

func serveConsole(ctx context.Context, srv *console.Server, listen string, logger *slog.Logger, cmd *cobra.Command) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	hs := srv.HTTPServer(listen)
	fmt.Fprintf(cmd.ErrOrStderr(), "ferry console on http://%s/\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		logger.WarnContext(ctx, "console shutdown", logattr.Err(err))
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
