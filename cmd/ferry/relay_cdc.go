package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/relay/cdc"
)

// cdcOptions are the CDC relay's options its flags set (checked before
// anything connects, like pollOptions).
func cdcOptions(f *relayFlags) []cdc.Option {
	return []cdc.Option{cdc.WithTables(f.store.tables()), cdc.WithSlotName(f.slot), cdc.WithPublicationName(f.publication),
		cdc.WithMaxPendingBytes(f.pendingBytes)}
}

// runCDCRelay runs `ferry relay --mode cdc`: the log-based relay reading
// committed outbox inserts from a logical replication slot (Postgres only).
// The destination was checked (or provisioned) like the polling relay's.
func runCDCRelay(ctx context.Context, f *relayFlags, st *store, pub broker.Publisher, reg *prometheus.Registry, log *slog.Logger) error {
	if st.dialect != driver.Postgres {
		return fmt.Errorf("--mode cdc needs Postgres (logical replication); --database-url is %s", st.dialect)
	}
	r, err := cdc.New(f.store.url, pub, append(cdcOptions(f), cdc.WithTables(st.tables), cdc.WithLogger(log), cdc.WithRegisterer(reg))...)
	if err != nil {
		return relayFlagError(err)
	}
	if f.listen != "" {
		ln, err := net.Listen("tcp", f.listen)
		if err != nil {
			return fmt.Errorf("--listen %s: %w", f.listen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if r.Status().Role == cdc.RoleStopped {
				http.Error(w, "relay not running", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		// Ready = streaming from the slot. A standby is healthy but not ready.
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			s := r.Status()
			if s.Role != cdc.RoleActive {
				http.Error(w, fmt.Sprintf("not ready: role=%s slot=%s last_error=%q", s.Role, s.Slot, s.LastError), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "ready: slot=%s confirmed_lsn=%s lag_bytes=%d\n", s.Slot, s.ConfirmedLSN, s.LagBytes)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.InfoContext(ctx, "serving /metrics /healthz /readyz", "addr", ln.Addr().String())
	}
	log.InfoContext(ctx, "cdc relay starting", "broker", pub.Name(), "slot", f.slot, "publication", f.publication)
	return r.Run(ctx)
}
