// Package natsembed runs NATS JetStream in process: the broker of Ferry's
// embedded stack (ferry demo, SQLite deployments) and of tests that stop and
// restart a broker. It is its own package so that importing
// github.com/ferryhq/ferry/broker/natsjs does not link nats-server, as
// franz-go keeps kfake apart from kgo.
package natsembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an in-process NATS server with JetStream, for the embedded
// stack (ferry demo, SQLite deployments) and for tests that need to stop
// and restart a broker. It listens on loopback only.
//
// Shutdown stops it and keeps the store; Restart brings it back on the same
// port and store directory, so clients reconnect to the same URL and find
// their streams and consumers again. Close stops it for good and removes a
// store directory it created itself.
type Server struct {
	mu       sync.Mutex
	opts     server.Options
	srv      *server.Server
	storeDir string
	ownsDir  bool
	closed   bool
	log      *slog.Logger // nil: the server logs nothing
}

// Option configures Start.
type Option func(*config) error

type config struct {
	storeDir     string
	port         int
	maxPayload   int32
	syncAlways   bool
	syncInterval time.Duration
	readyTimeout time.Duration
	log          *slog.Logger
}

// WithStoreDir keeps JetStream's files in dir (created if missing) instead
// of a fresh temporary directory. Use it to keep data across process
// restarts; Close does not remove a directory given here.
func WithStoreDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("natsembed: WithStoreDir: dir must not be empty")
		}
		c.storeDir = dir
		return nil
	}
}

// WithPort listens on the given loopback port instead of a random free one.
func WithPort(port int) Option {
	return func(c *config) error {
		if port < 1 || port > 65535 {
			return fmt.Errorf("natsembed: WithPort: %d is outside 1..65535", port)
		}
		c.port = port
		return nil
	}
}

// WithMaxPayload sets the server's max_payload in bytes (default 1 MiB);
// messages above it are rejected by the client before sending.
func WithMaxPayload(n int32) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("natsembed: WithMaxPayload: %d must be >= 1", n)
		}
		c.maxPayload = n
		return nil
	}
}

// WithSyncAlways makes JetStream fsync every message before acknowledging
// it (sync_interval: always). Without it an acknowledged message can be lost
// if the machine (not just the process) crashes within the sync interval.
// It costs throughput; the embedded default is the server's default
// (fsync every 2 minutes, writes go to the OS page cache at once).
func WithSyncAlways() Option {
	return func(c *config) error {
		c.syncAlways = true
		return nil
	}
}

// WithSyncInterval sets JetStream's periodic fsync interval.
func WithSyncInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("natsembed: WithSyncInterval: %v must be > 0", d)
		}
		c.syncInterval = d
		return nil
	}
}

// WithLogger sends the server's own log lines to l: its errors (and
// fatal errors, which do not end the process here) at Error, its warnings
// at Warn, its notices (a start prints a dozen) at Debug; its debug and
// trace lines are not produced. Without it the server logs nothing, and a
// failure it explains only in its log — a stream create answered "error
// creating store for stream", the cause in a warning beside it — is lost.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("natsembed: WithLogger: logger must not be nil")
		}
		c.log = l
		return nil
	}
}

// Start starts an in-process NATS server with JetStream (file
// storage) on 127.0.0.1 and waits until it accepts connections.
func Start(opts ...Option) (*Server, error) {
	cfg := config{readyTimeout: 10 * time.Second}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	e := &Server{storeDir: cfg.storeDir, log: cfg.log}
	if e.storeDir == "" {
		dir, err := os.MkdirTemp("", "ferry-nats-*")
		if err != nil {
			return nil, fmt.Errorf("natsembed: embedded store dir: %w", err)
		}
		e.storeDir, e.ownsDir = dir, true
	} else if err := os.MkdirAll(e.storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("natsembed: embedded store dir: %w", err)
	}
	port := cfg.port
	if port == 0 {
		p, err := freePort()
		if err != nil {
			e.removeDir()
			return nil, err
		}
		port = p
	}
	e.opts = server.Options{
		ServerName:   "ferry-embedded",
		Host:         "127.0.0.1",
		Port:         port,
		JetStream:    true,
		StoreDir:     e.storeDir,
		MaxPayload:   cfg.maxPayload,
		SyncAlways:   cfg.syncAlways,
		SyncInterval: cfg.syncInterval,
		NoLog:        true,
		NoSigs:       true,
		HTTPPort:     0,
	}
	if err := e.start(); err != nil {
		e.removeDir()
		return nil, err
	}
	return e, nil
}

// freePort asks the kernel for a free loopback port. The port is fixed for
// the Server's lifetime so that Restart comes back at the same URL.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("natsembed: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (e *Server) start() error {
	opts := e.opts // the server keeps and mutates its copy
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("natsembed: embedded server: %w", err)
	}
	if e.log != nil {
		srv.SetLoggerV2(serverLog{e.log}, false, false, false)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("natsembed: embedded server on port %d not ready within 10s", e.opts.Port)
	}
	e.srv = srv
	return nil
}

// ClientURL is the nats:// URL clients connect to. It stays the same
// across Shutdown and Restart.
func (e *Server) ClientURL() string {
	return "nats://" + net.JoinHostPort(e.opts.Host, strconv.Itoa(e.opts.Port))
}

// StoreDir is where JetStream keeps its files.
func (e *Server) StoreDir() string { return e.storeDir }

// Running reports whether the server is up.
func (e *Server) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv != nil
}

// IsStreamLeader reports whether this server takes itself for the leader
// of stream (global account) right now. In a cluster a leader cut off
// from the others keeps taking itself for one, and answering reads, until
// it notices it lost its quorum: a reader that must see the stream's
// committed state can wait until exactly one node says so. False when the
// server is stopped or not clustered.
func (e *Server) IsStreamLeader(stream string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return false
	}
	return e.srv.JetStreamIsStreamLeader(e.srv.GlobalAccount().Name, stream)
}

// IsConsumerLeader is IsStreamLeader for a consumer of stream (global
// account): a cut-off consumer leader keeps answering consumer info with
// its own ack floor and pending counts until it steps down.
func (e *Server) IsConsumerLeader(stream, consumer string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return false
	}
	return e.srv.JetStreamIsConsumerLeader(e.srv.GlobalAccount().Name, stream, consumer)
}

// Shutdown stops the server and waits until it has stopped (every server
// goroutine ended, files closed). The store is kept; Restart resumes from
// it. Calling Shutdown on a stopped server does nothing.
func (e *Server) Shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdownLocked()
}

func (e *Server) shutdownLocked() {
	if e.srv == nil {
		return
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.srv = nil
}

// Restart starts a stopped server again on the same port and store
// directory (streams, consumers and messages are recovered from disk).
// It fails if the server is running or closed, or if the port was taken
// in the meantime.
func (e *Server) Restart() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("natsembed: Restart after Close")
	}
	if e.srv != nil {
		return errors.New("natsembed: Restart of a running server")
	}
	return e.start()
}

// Close shuts the server down and removes the store directory if
// Start created it.
func (e *Server) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdownLocked()
	if e.closed {
		return nil
	}
	e.closed = true
	return e.removeDir()
}

func (e *Server) removeDir() error {
	if !e.ownsDir {
		return nil
	}
	if err := os.RemoveAll(e.storeDir); err != nil {
		return fmt.Errorf("natsembed: remove store dir: %w", err)
	}
	return nil
}

// serverLog adapts slog to nats-server's Logger. The lines are the
// server's own (subjects, stream and account names; never message data).
type serverLog struct{ l *slog.Logger }

func (s serverLog) logf(level slog.Level, format string, v []any) {
	if !s.l.Enabled(context.Background(), level) {
		return
	}
	s.l.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "nats-server")
}

func (s serverLog) Noticef(format string, v ...any) { s.logf(slog.LevelDebug, format, v) }
func (s serverLog) Warnf(format string, v ...any)   { s.logf(slog.LevelWarn, format, v) }
func (s serverLog) Fatalf(format string, v ...any)  { s.logf(slog.LevelError, format, v) }
func (s serverLog) Errorf(format string, v ...any)  { s.logf(slog.LevelError, format, v) }
func (s serverLog) Debugf(format string, v ...any)  { s.logf(slog.LevelDebug, format, v) }
func (s serverLog) Tracef(format string, v ...any)  { s.logf(slog.LevelDebug, format, v) }
