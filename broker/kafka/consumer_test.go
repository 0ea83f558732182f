package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
)

// seen is what a test handler observed.
type seen struct {
	seq     int64
	attempt int
	d       *broker.Delivery
}

// runConsumer runs Consume in a goroutine, sending each delivery to the
// returned channel; stop cancels it and waits for it to return.
func runConsumer(t *testing.T, cons *kafka.Consumer) (<-chan seen, func()) {
	t.Helper()
	ch := make(chan seen, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cons.Consume(ctx, func(_ context.Context, d *broker.Delivery) {
			ch <- seen{seq: d.Event.AggregateSeq, attempt: d.Attempt, d: d}
		})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ch, stop
}

func next(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery within 15s")
	}
	return seen{}
}

func committed(t *testing.T, c *kfake.Cluster, group, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	o, ok := offs.Lookup(topic, 0)
	if !ok {
		return -1
	}
	return o.At
}

func publishSeqs(t *testing.T, c *kfake.Cluster, topic string, n int) []ferry.Event {
	t.Helper()
	p := newPublisher(t, c)
	evs := make([]ferry.Event, n)
	for i := range evs {
		evs[i] = event(t, topic, "a", int64(i+1))
	}
	mustOK(t, p.Publish(context.Background(), evs))
	return evs
}

func waitCommitted(t *testing.T, c *kfake.Cluster, group, topic string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := committed(t, c, group, topic)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offset = %d, want %d", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConsumerNeverCommitsPastUnacked: records 0..9, every one acked but
// offset 3. The committed offset stops at 3 however long we wait. After a
// crash (Close without acking 3) a new consumer gets 3 again and 4..9 as
// duplicates: nothing is lost.
func TestConsumerNeverCommitsPastUnacked(t *testing.T) {
	const topic, group = "t1", "g1"
	c := newCluster(t, 1, topic)
	publishSeqs(t, c, topic, 10)

	cons := newConsumer(t, c, group, []string{topic})
	ch, stop := runConsumer(t, cons)
	for i := 0; i < 10; i++ {
		s := next(t, ch)
		if s.d.DecodeErr != nil {
			t.Fatalf("decode: %v", s.d.DecodeErr)
		}
		if s.seq != int64(i+1) || s.attempt != 1 {
			t.Fatalf("delivery %d: seq %d attempt %d", i, s.seq, s.attempt)
		}
		if i == 3 {
			continue // held: its transaction never commits
		}
		if err := s.d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := s.d.Ack(context.Background()); !errors.Is(err, kafka.ErrSettled) {
			t.Fatalf("second Ack: %v", err)
		}
	}
	waitCommitted(t, c, group, topic, 3)
	time.Sleep(300 * time.Millisecond) // several commit intervals
	if got := committed(t, c, group, topic); got != 3 {
		t.Fatalf("committed %d past the unacked offset 3", got)
	}
	stop()
	_ = cons.Close()
	if got := committed(t, c, group, topic); got != 3 {
		t.Fatalf("after shutdown committed %d, want 3", got)
	}

	// Restart: 3 is redelivered, then 4..9 as duplicates.
	cons2 := newConsumer(t, c, group, []string{topic})
	ch2, stop2 := runConsumer(t, cons2)
	defer stop2()
	dups := 0
	for want := int64(4); want <= 10; want++ {
		s := next(t, ch2)
		if s.seq != want {
			t.Fatalf("after restart got seq %d, want %d", s.seq, want)
		}
		if want > 4 {
			dups++ // acked before the crash: a duplicate, never a loss
		}
		if err := s.d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if dups != 6 {
		t.Fatalf("duplicates %d, want 6", dups)
	}
	waitCommitted(t, c, group, topic, 10)
}

// TestNaiveCommitLosesUnacked is the negative control for the test above:
// committing the highest delivered offset (what autocommit does) skips the
// unacked record for good after a crash.
func TestNaiveCommitLosesUnacked(t *testing.T) {
	const topic, group = "t1", "naive"
	c := newCluster(t, 1, topic)
	publishSeqs(t, c, topic, 10)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) < 10 && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	// "Acked" all but offset 3, then committed the highest offset seen.
	if err := cl.CommitRecords(ctx, got[len(got)-1]); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	cons := newConsumer(t, c, group, []string{topic})
	ch, stop := runConsumer(t, cons)
	defer stop()
	p := newPublisher(t, c)
	marker := event(t, topic, "a", 11)
	mustOK(t, p.Publish(context.Background(), []ferry.Event{marker}))
	s := next(t, ch)
	if s.seq == 4 {
		t.Fatal("naive commit redelivered the unacked record: the negative control cannot fail")
	}
	if s.seq != 11 {
		t.Fatalf("got seq %d", s.seq)
	}
	// seq 4 (offset 3) is lost for this group: the violation Ferry's
	// acked-prefix commit prevents.
}

// TestNackRewindsPartition: a nacked record is handed to handle again after
// the delay, with Attempt 2, followed by every later record of the
// partition in order (rewind); acked ones come again as duplicates.
func TestNackRewindsPartition(t *testing.T) {
	const topic, group = "t1", "g1"
	c := newCluster(t, 1, topic)
	publishSeqs(t, c, topic, 5)

	cons := newConsumer(t, c, group, []string{topic})
	ch, _ := runConsumer(t, cons)
	var order []int64
	start := time.Now()
	var nackedAt time.Time
	for i := 0; i < 5; i++ {
		s := next(t, ch)
		order = append(order, s.seq)
		if s.seq == 2 {
			nackedAt = time.Now()
			if err := s.d.Nack(context.Background(), 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			continue
		}
		_ = s.d.Ack(context.Background())
	}
	for i := 0; i < 4; i++ {
		s := next(t, ch)
		order = append(order, s.seq)
		if s.seq == 2 {
			if s.attempt != 2 {
				t.Fatalf("redelivered seq 2 attempt = %d, want 2", s.attempt)
			}
			if time.Since(nackedAt) < 200*time.Millisecond {
				t.Fatalf("redelivered after %v, before the 200ms delay", time.Since(nackedAt))
			}
		}
		_ = s.d.Ack(context.Background())
	}
	want := []int64{1, 2, 3, 4, 5, 2, 3, 4, 5}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("delivery order %v, want %v", order, want)
		}
	}
	waitCommitted(t, c, group, topic, 5)
	_ = start
}

// TestLateNackDoesNotSkipEarlierRewind: seq 3 is nacked and its rewind
// applied; while the refetch from its offset is still on the way, a copy
// of seq 5 delivered before that rewind is nacked too. Seeking to seq 5's
// offset then would jump past seq 3 and 4, which nothing would ever
// deliver again (until a restart): seen in ferry prove's db-crash on kfake,
// an event stuck unapplied while the consumer re-read the partition. The
// refetch must deliver seq 3 again. kfake holds every fetch for 800 ms
// once armed, so the second nack lands inside that window.
func TestLateNackDoesNotSkipEarlierRewind(t *testing.T) {
	const topic, group = "t-late-nack", "g-late-nack"
	c := newCluster(t, 1, topic)
	publishSeqs(t, c, topic, 6)
	var slow atomic.Bool
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if slow.Load() {
			time.Sleep(800 * time.Millisecond)
		}
		return nil, nil, false
	})

	cons := newConsumer(t, c, group, []string{topic})
	ch, _ := runConsumer(t, cons)
	held := map[int64]*broker.Delivery{}
	for range 6 {
		s := next(t, ch)
		if s.seq == 3 || s.seq == 5 {
			held[s.seq] = s.d
			continue
		}
		_ = s.d.Ack(context.Background())
	}
	slow.Store(true)
	if err := held[3].Nack(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	// The rewind to seq 3 is applied within a poll; its refetch then
	// waits in kfake.
	time.Sleep(300 * time.Millisecond)
	if err := held[5].Nack(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	var got []int64
	three := false
	for {
		select {
		case s := <-ch:
			got = append(got, s.seq)
			_ = s.d.Ack(context.Background())
			if s.seq == 3 {
				three = true
				if s.attempt != 2 {
					t.Errorf("seq 3 redelivered with attempt %d, want 2", s.attempt)
				}
			}
			if three && s.seq == 6 {
				slow.Store(false)
				waitCommitted(t, c, group, topic, 6)
				return
			}
		case <-deadline:
			t.Fatalf("seq 3 was never redelivered after its nack (redeliveries seen: %v): a later rewind skipped it", got)
		}
	}
}

// TestUndecodableRecordIsDelivered: a record that is not a CloudEvent
// reaches handle with DecodeErr and the raw bytes; acking it commits.
func TestUndecodableRecordIsDelivered(t *testing.T) {
	const topic, group = "t1", "g1"
	c := newCluster(t, 1, topic)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("not an event"),
		Headers: []kgo.RecordHeader{{Key: "x", Value: []byte("y")}}}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cons := newConsumer(t, c, group, []string{topic})
	ch, _ := runConsumer(t, cons)
	s := next(t, ch)
	if s.d.DecodeErr == nil {
		t.Fatal("DecodeErr is nil for a non-CloudEvents record")
	}
	if string(s.d.Raw.Body) != "not an event" || s.d.Raw.Key != "k" || s.d.Raw.Headers["x"] != "y" || s.d.Raw.Destination != topic {
		t.Fatalf("raw = %+v", s.d.Raw)
	}
	if err := s.d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, c, group, topic, 1)
}

func TestConsumerLag(t *testing.T) {
	const topic, group = "t1", "g1"
	c := newCluster(t, 1, topic)
	publishSeqs(t, c, topic, 8)
	cons := newConsumer(t, c, group, []string{topic})
	ch, _ := runConsumer(t, cons)
	for i := 0; i < 8; i++ {
		s := next(t, ch)
		if i < 5 {
			_ = s.d.Ack(context.Background())
		}
	}
	waitCommitted(t, c, group, topic, 5)
	lag, err := cons.Lag(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if lag.Total != 3 || lag.Partitions[topic][0] != 3 {
		t.Fatalf("lag = %+v, want 3", lag)
	}
}

func TestConsumerConfig(t *testing.T) {
	if _, err := kafka.NewConsumer([]string{"x:1"}, "", []string{"t"}); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("empty group: %v", err)
	}
	if _, err := kafka.NewConsumer([]string{"x:1"}, "g", nil); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("no topics: %v", err)
	}
	if _, err := kafka.NewConsumer([]string{"x:1"}, "g", []string{"t"}, kafka.WithMaxPollRecords(0)); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("max poll 0: %v", err)
	}
}

// TestRebalanceCommitsAckedPrefixOnRevoke: consumer A holds every
// partition and acks everything but seq 3 of each aggregate; the periodic
// commit is effectively off (1h), so only the revoke can commit. Member B
// joins: for the partitions that move, B must start at A's first un-acked
// offset — never earlier (that would mean the revoke did not commit A's
// acked prefix) and never later (that would lose the held record). Then A
// leaves without acking: B gets every held record.
func TestRebalanceCommitsAckedPrefixOnRevoke(t *testing.T) {
	const topic, group = "t4", "g-rebalance"
	c := newCluster(t, 4, topic)
	p := newPublisher(t, c)
	var evs []ferry.Event
	for a := 0; a < 8; a++ {
		for seq := int64(1); seq <= 5; seq++ {
			evs = append(evs, event(t, topic, fmt.Sprintf("agg%d", a), seq))
		}
	}
	res := p.Publish(context.Background(), evs)
	mustOK(t, res)
	where := map[string]broker.Receipt{}
	firstHeld := map[int32]int64{}
	held := map[string]bool{}
	for i, r := range res {
		where[evs[i].ID.String()] = r.Receipt
		if evs[i].AggregateSeq == 3 {
			held[evs[i].ID.String()] = true
			if o, ok := firstHeld[r.Receipt.Partition]; !ok || r.Receipt.Offset < o {
				firstHeld[r.Receipt.Partition] = r.Receipt.Offset
			}
		}
	}

	consA := newConsumer(t, c, group, []string{topic}, kafka.WithCommitInterval(time.Hour))
	chA, stopA := runConsumer(t, consA)
	for i := 0; i < len(evs); i++ {
		s := next(t, chA)
		if !held[s.d.Event.ID.String()] {
			_ = s.d.Ack(context.Background())
		}
	}

	consB := newConsumer(t, c, group, []string{topic}, kafka.WithCommitInterval(50*time.Millisecond))
	chB, _ := runConsumer(t, consB)
	check := func(s seen) {
		r := where[s.d.Event.ID.String()]
		if r.Offset < firstHeld[r.Partition] {
			t.Fatalf("B got partition %d offset %d, before A's first un-acked offset %d: the revoke did not commit A's acked prefix",
				r.Partition, r.Offset, firstHeld[r.Partition])
		}
		delete(held, s.d.Event.ID.String())
		_ = s.d.Ack(context.Background())
	}
	// B's first deliveries (partitions that moved), then A leaves.
	settle := time.After(3 * time.Second)
loop:
	for {
		select {
		case s := <-chB:
			check(s)
		case <-settle:
			break loop
		}
	}
	stopA()
	_ = consA.Close()
	deadline := time.After(30 * time.Second)
	for len(held) > 0 {
		select {
		case s := <-chB:
			check(s)
		case <-deadline:
			t.Fatalf("held events never redelivered: %d left", len(held))
		}
	}
}
