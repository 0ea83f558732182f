package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes lines back until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		close(conns)
		for c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestPassAndDelay(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if got, err := roundTrip(c, "hello", time.Second); err != nil || got != "hello\n" {
		t.Fatalf("pass: %q %v", got, err)
	}
	p.SetDelay(150 * time.Millisecond)
	p.Set(Delay)
	start := time.Now()
	if got, err := roundTrip(c, "slow", 2*time.Second); err != nil || got != "slow\n" {
		t.Fatalf("delay: %q %v", got, err)
	}
	// Both directions are delayed: at least two chunk delays.
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("delay mode took only %s", d)
	}
}

func TestDropStallsWithoutClosing(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Set(Drop)
	_, err := roundTrip(c, "lost", 200*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("drop: want a timeout, got %v", err)
	}
}

func TestResetAbortsOpenAndNewConnections(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Set(Reset)
	_, err := roundTrip(c, "after", time.Second)
	if err == nil {
		t.Fatal("open connection survived a reset")
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("want a reset, got %v", err)
	}
	// A new connection is reset at once: either the dial itself or the
	// first round trip fails, depending on when the RST arrives.
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(c2, "new", time.Second)
		_ = c2.Close()
		if err == nil {
			t.Fatal("new connection passed in reset mode")
		}
	}
	if p.Stats().Resets < 2 {
		t.Fatalf("resets = %d", p.Stats().Resets)
	}
	p.Set(Pass)
	c3 := dial(t, p)
	if got, err := roundTrip(c3, "healed", time.Second); err != nil || got != "healed\n" {
		t.Fatalf("after heal: %q %v", got, err)
	}
}

// TestCutAndRestore: Cut ends a connection opened before it and refuses
// new ones; Restore forwards again (what outage tests through
// brokertest.NewProxy rely on).
func TestCutAndRestore(t *testing.T) {
	p := newProxy(t)
	held := dial(t, p)
	if _, err := roundTrip(held, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := roundTrip(held, "after", time.Second); err == nil {
		t.Fatal("connection open before Cut still answers after it")
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(c, "new", time.Second)
		_ = c.Close()
		if err == nil {
			t.Fatal("new connection worked while cut")
		}
	}
	p.Restore()
	if got, err := roundTrip(dial(t, p), "back", time.Second); err != nil || got != "back\n" {
		t.Fatalf("after Restore: %q %v", got, err)
	}
}

func TestBlackholeAcceptsAndHangs(t *testing.T) {
	p := newProxy(t)
	p.Set(Blackhole)
	c := dial(t, p) // the dial succeeds...
	_, err := roundTrip(c, "anyone?", 200*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackhole: want a timeout, got %v", err)
	}
}

func TestNewValidatesAndCloseTwice(t *testing.T) {
	if _, err := New("no-port"); err == nil {
		t.Fatal("want an error for a target without port")
	}
	p := newProxy(t)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if Blackhole.String() != "blackhole" || Mode(99).String() != "mode(99)" {
		t.Fatal("mode names")
	}
}
