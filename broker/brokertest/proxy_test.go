package brokertest

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxyCutAndRestore(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("through proxy: %v", err)
	}
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	time.Sleep(50 * time.Millisecond) // let the proxy register it
	p.Cut()
	_ = held.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection open before Cut still readable after it")
	}
	if err := roundTrip(p.Addr()); err == nil {
		t.Fatal("new connection worked while cut")
	}
	p.Restore()
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}
