package inbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/kafka"
)

// Kafka (in-process kfake, real wire protocol) into SQLite: duplicates and
// a crash after commit before ack, through the adapter that commits an
// offset only when every earlier record of the partition was acked.
func TestKafkaToSQLite(t *testing.T) {
	const topic = "order.events"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.NewPublisher(cluster.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	s := stores(t)
	st := s[len(s)-1] // sqlite
	consumer := func() *kafka.Consumer {
		c, err := kafka.NewConsumer(cluster.ListenAddrs(), "shipping", []string{topic}, kafka.WithCommitInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var evs []ferry.Event
	for a := range 5 {
		for seq := int64(1); seq <= 4; seq++ {
			evs = append(evs, event(t, "acme", string(rune('a'+a)), seq, "k"))
		}
	}
	// Every event published twice: Kafka keeps both records.
	for _, batch := range [][]ferry.Event{evs, evs} {
		for _, r := range pub.Publish(context.Background(), batch) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}

	// First run crashes after its first commit, before the ack.
	crash := errors.New("kill -9")
	faulty := newInbox(t, st, nil, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
	c1 := consumer()
	if err := faulty.Run(context.Background(), c1); !errors.Is(err, ErrFault) {
		t.Fatalf("Run with fault: %v", err)
	}
	_ = c1.Close()
	if n := len(effects(t, st.db)); n < 1 {
		t.Fatal("the crashed run committed nothing")
	}

	c2 := consumer()
	defer c2.Close()
	ib := newInbox(t, st, nil, WithLag(func(ctx context.Context) (int64, error) {
		l, err := c2.Lag(ctx)
		return l.Total, err
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, c2) }()
	deadline := time.Now().Add(30 * time.Second)
	for len(effects(t, st.db)) < len(evs) || ib.Stats().Duplicates < int64(len(evs)) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("timeout: effects %d, stats %+v", len(effects(t, st.db)), ib.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	es := effects(t, st.db)
	if len(es) != len(evs) {
		t.Fatalf("effects = %d, want %d (each once)", len(es), len(evs))
	}
	last := map[string]int64{}
	for _, e := range es {
		if e.seq != last[e.agg]+1 {
			t.Fatalf("aggregate %s: %d after %d", e.agg, e.seq, last[e.agg])
		}
		last[e.agg] = e.seq
	}
}
