package runstate

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	errClosed    = errors.New("closed")
	errConsuming = errors.New("consuming")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBeginOnceAtATime(t *testing.T) {
	var s State
	ctx, end, err := s.Begin(context.Background(), errClosed, errConsuming)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(context.Background(), errClosed, errConsuming); !errors.Is(err, errConsuming) {
		t.Fatalf("second Begin while running: %v, want errConsuming", err)
	}
	end()
	if ctx.Err() == nil {
		t.Fatal("end did not cancel Consume's context")
	}
	_, end2, err := s.Begin(context.Background(), errClosed, errConsuming)
	if err != nil {
		t.Fatalf("Begin after end: %v", err)
	}
	end2()
}

func TestCloseWaitsForConsume(t *testing.T) {
	var s State
	ctx, end, err := s.Begin(context.Background(), errClosed, errConsuming)
	if err != nil {
		t.Fatal(err)
	}
	var returned atomic.Bool
	go func() {
		<-ctx.Done() // Consume notices Close through its context
		time.Sleep(20 * time.Millisecond)
		returned.Store(true)
		end()
	}()
	if !s.Close() {
		t.Fatal("first Close reported not closing")
	}
	if !returned.Load() {
		t.Fatal("Close returned before Consume did")
	}
	if s.Close() {
		t.Fatal("second Close reported closing")
	}
	if _, _, err := s.Begin(context.Background(), errClosed, errConsuming); !errors.Is(err, errClosed) {
		t.Fatalf("Begin after Close: %v, want errClosed", err)
	}
}

func TestTimersEndWithConsume(t *testing.T) {
	var s State
	if s.AfterFunc(time.Millisecond, func() {}) {
		t.Fatal("AfterFunc scheduled while not consuming")
	}
	_, end, err := s.Begin(context.Background(), errClosed, errConsuming)
	if err != nil {
		t.Fatal(err)
	}
	fired := make(chan struct{}, 1)
	if !s.AfterFunc(5*time.Millisecond, func() { fired <- struct{}{} }) {
		t.Fatal("AfterFunc refused while consuming")
	}
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("timer did not fire")
	}
	if n := s.Pending(); n != 0 {
		t.Fatalf("%d timers pending after firing", n)
	}
	var late atomic.Bool
	s.AfterFunc(50*time.Millisecond, func() { late.Store(true) })
	if s.Pending() != 1 {
		t.Fatal("timer not tracked")
	}
	end()
	time.Sleep(100 * time.Millisecond)
	if late.Load() {
		t.Fatal("a timer fired after Consume returned")
	}
	if n := s.Pending(); n != 0 {
		t.Fatalf("%d timers pending after end", n)
	}
}
