package shadow_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/internal/faultproxy"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/shadow"
)

// TestReadNATSEmptyFetchIsNotTheEnd: a fetch that comes back empty while
// matching messages remain must not end the read. Here the server's
// answers arrive later than the fetch waits (a proxy adds latency), as
// they do from a slow or busy server; the read used to return what it had
// at the first empty fetch — nothing — without an error. The control
// shows the condition: through the delaying proxy an ordered consumer's
// fetch comes back empty while the consumer still owes every message.
func TestReadNATSEmptyFetchIsNotTheEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sysURL := testenv.NATSURL(t)
	nc, err := natsjs.Connect(sysURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	stream, subject := "SHADOWREAD_"+sfx, "shadowread."+sfx
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	const n = 600
	for i := range n {
		subj := subject + ".a"
		if i%3 == 0 {
			subj = subject + ".b"
		}
		if _, err := js.PublishAsync(subj, fmt.Appendf(nil, "m-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged")
	}

	u, err := url.Parse(sysURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.SetDelay(1500 * time.Millisecond)
	pnc, err := natsjs.Connect("nats://" + proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 200 * time.Millisecond // shorter than the proxy's latency

	t.Run("control", func(t *testing.T) {
		proxy.Restore()
		st, err := pjs.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		proxy.Set(faultproxy.Delay)
		b, err := cons.Fetch(256, jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for range b.Messages() {
			got++
		}
		proxy.Restore()
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != 0 || ci.NumPending == 0 {
			t.Fatalf("through the delaying proxy a fetch got %d messages with %d pending: want an empty fetch while messages remain", got, ci.NumPending)
		}
		t.Logf("an empty fetch with %d messages pending", ci.NumPending)
	})

	for _, tc := range []struct {
		subject string
		want    int
	}{{"", n}, {subject + ".b", n / 3}} {
		// The proxy delays everything until restored a while into the
		// read: the stream's lookup, its info and the consumer's creation
		// take 3 s each, and every fetch after them comes back empty (a
		// fetch waits its wait plus 1 s for an answer 3 s away).
		proxy.Set(faultproxy.Delay)
		const slowFor = 15 * time.Second
		restored := time.AfterFunc(slowFor, proxy.Restore)
		t0 := time.Now()
		msgs, err := shadow.ReadNATSWait(ctx, pjs, stream, tc.subject, time.Time{}, wait)
		took := time.Since(t0)
		restored.Stop()
		proxy.Restore()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("subject %q: %d messages in %v", tc.subject, len(msgs), took)
		if len(msgs) != tc.want {
			t.Fatalf("subject %q: read %d messages, want %d", tc.subject, len(msgs), tc.want)
		}
		if took < slowFor {
			t.Errorf("subject %q: the read ended after %v, before the proxy stopped delaying: it met no empty fetch", tc.subject, took)
		}
		for i := 1; i < len(msgs); i++ {
			if msgs[i].Seq <= msgs[i-1].Seq {
				t.Fatalf("subject %q: sequence %d after %d", tc.subject, msgs[i].Seq, msgs[i-1].Seq)
			}
		}
	}
}
