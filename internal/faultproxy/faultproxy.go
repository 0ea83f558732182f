// Package faultproxy is a small TCP proxy that injects network faults
// between a client and a server: added latency, silently dropped data,
// connection resets and a black hole. `ferry prove` puts it in front of the
// broker (and can put it in front of the database) to show what outages do
// to the pipeline; tests use it to cut a connection they do not own the
// server of, without stopping a shared service.
//
// It works on byte streams, not protocol messages: "drop" discards whatever
// bytes arrive while it is on (the protocol above sees a stall and, usually,
// a corrupt stream after), which is what a lossy middlebox does to TCP
// payloads once retransmission gives up. Shopify's toxiproxy does more; this
// is the hundred lines prove needs, with no extra module.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is the fault applied to traffic.
type Mode int32

// The modes.
const (
	// Pass forwards traffic unchanged.
	Pass Mode = iota
	// Delay forwards each chunk after the configured latency.
	Delay
	// Drop accepts and reads traffic but forwards none of it; connections
	// stay open (a stall, not an error).
	Drop
	// Reset aborts every open connection with a TCP RST and resets new
	// ones as soon as they are accepted.
	Reset
	// Blackhole is Drop plus: new connections are accepted and never
	// connected upstream, so a client's dial succeeds and then hangs.
	Blackhole
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Delay:
		return "delay"
	case Drop:
		return "drop"
	case Reset:
		return "reset"
	case Blackhole:
		return "blackhole"
	}
	return fmt.Sprintf("mode(%d)", int32(m))
}

// ErrClosed is returned by operations on a closed proxy.
var ErrClosed = errors.New("faultproxy: closed")

// Proxy forwards connections from a loopback listener to a target.
type Proxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32
	delay  atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Int64
	resets   atomic.Int64
}

// Stats are counters for reports.
type Stats struct {
	Accepted int64 // connections accepted
	Resets   int64 // connections aborted with RST
}

// New listens on 127.0.0.1 (a random port) and forwards to target
// ("host:port").
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stats returns the counters.
func (p *Proxy) Stats() Stats { return Stats{Accepted: p.accepted.Load(), Resets: p.resets.Load()} }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// SetDelay sets the latency Delay mode adds per chunk.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Set switches the mode. Switching to Reset aborts every open connection.
func (p *Proxy) Set(m Mode) {
	p.mode.Store(int32(m))
	if m == Reset {
		p.ResetAll()
	}
}

// Cut is Set(Reset): every open connection is aborted and new ones are
// reset until Restore, so to a client the server is gone. Outage tests
// against a shared server that must not be stopped use it.
func (p *Proxy) Cut() { p.Set(Reset) }

// Restore is Set(Pass): connections are forwarded again.
func (p *Proxy) Restore() { p.Set(Pass) }

// ResetAll aborts every open connection (both sides) with a TCP RST.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		p.resets.Add(1)
		abort(c)
	}
}

func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST instead of FIN
	}
	_ = c.Close()
}

// Close stops listening, aborts every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if !p.track(c) {
			abort(c)
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	switch p.Mode() {
	case Reset:
		p.resets.Add(1)
		abort(client)
		return
	case Blackhole:
		_, _ = io.Copy(io.Discard, client) // until the client gives up or Close
		_ = client.Close()
		return
	}
	upstream, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		abort(client)
		return
	}
	if !p.track(upstream) {
		abort(upstream)
		abort(client)
		return
	}
	defer p.untrack(upstream)
	done := make(chan struct{}, 2)
	go func() { p.pipe(upstream, client); done <- struct{}{} }()
	go func() { p.pipe(client, upstream); done <- struct{}{} }()
	<-done
	// One side ended: end the other so both goroutines return.
	_ = client.Close()
	_ = upstream.Close()
	<-done
}

// pipe copies src to dst chunk by chunk, applying the mode to each chunk.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch p.Mode() {
			case Drop, Blackhole:
				// discarded
			case Delay:
				time.Sleep(time.Duration(p.delay.Load()))
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			default:
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
