package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/runstate"
)

// Consumer errors.
var (
	// ErrConsuming: Consume was called while another Consume runs.
	ErrConsuming = errors.New("kafka: consumer already consuming")
	// ErrSettled: Ack or Nack was called twice for one delivery.
	ErrSettled = errors.New("kafka: delivery already acked or nacked")
	// ErrConsumerClosed: Consume was called after Close.
	ErrConsumerClosed = errors.New("kafka: consumer closed")
)

// Consumer reads a consumer group's partitions and commits, per partition,
// only the prefix of records that were all acked. See the package
// documentation for the commit and redelivery rules.
type Consumer struct {
	cl     *kgo.Client
	adm    *kadm.Client
	group  string
	cfg    config
	logger *slog.Logger

	// commitMu serialises commits with revokes, so a periodic commit
	// never lands after a revoked partition was handed to another member.
	commitMu sync.Mutex

	run runstate.State // Consume once at a time, Close waits for it, rewind timers

	mu         sync.Mutex
	parts      map[topicPartition]*partState
	gen        uint64
	wakePoll   context.CancelFunc // cancels the current poll so due rewinds run
	commitErrs int
}

var _ broker.Consumer = (*Consumer)(nil)

type topicPartition struct {
	topic     string
	partition int32
}

// partState tracks one assigned partition. Offsets are delivered in order,
// so pending is ascending; the commit point is the first offset in pending
// not yet acked (everything before it was acked), or next when all are.
type partState struct {
	gen       uint64
	pending   []int64        // delivered, not yet below the commit point
	acked     map[int64]bool // offsets in pending that were acked
	attempts  map[int64]int  // deliveries per offset in pending
	next      int64          // offset after the highest delivered record; -1 before the first
	committed int64          // last committed offset; -1 unknown

	rewindTo  int64 // -1: none; else the lowest nacked offset to refetch from
	rewindDue time.Time
	// cursor is the offset the partition's fetches deliver next: the
	// offset after the last record handed out, or the offset of the last
	// rewind applied (SetOffsets drops buffered fetches). -1 before the
	// first delivery. A rewind to an offset at or after it is not needed
	// (those records come anyway) and must not be applied: it would seek
	// forward past records an earlier rewind is about to refetch.
	cursor int64
}

func (s *partState) commitPoint() int64 {
	for len(s.pending) > 0 && s.acked[s.pending[0]] {
		o := s.pending[0]
		delete(s.acked, o)
		delete(s.attempts, o)
		s.pending = s.pending[1:]
	}
	if len(s.pending) > 0 {
		return s.pending[0]
	}
	return s.next
}

// NewConsumer creates a consumer of topics in group. Autocommit is off:
// offsets move only as deliveries are acked (see the package doc). A group
// with no committed offset starts at the beginning of each partition, so
// nothing published before the consumer's first start is skipped.
func NewConsumer(seeds []string, group string, topics []string, opts ...Option) (*Consumer, error) {
	if len(seeds) == 0 {
		return nil, &ferry.ConfigError{Field: "kafka.seeds", Reason: "at least one seed broker is required"}
	}
	if group == "" {
		return nil, &ferry.ConfigError{Field: "kafka.group", Reason: "must not be empty"}
	}
	if len(topics) == 0 {
		return nil, &ferry.ConfigError{Field: "kafka.topics", Reason: "at least one topic is required"}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.group.resolve(); err != nil {
		return nil, err
	}
	c := &Consumer{
		group:  group,
		cfg:    cfg,
		logger: cfg.logger.With("broker", BrokerName, "group", group),
		parts:  make(map[topicPartition]*partState),
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ClientID(cfg.clientID),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Rebalances wait until the polled batch was handed over and
		// due rewinds were applied, so SetOffsets never races a revoke.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.WithLogger(kgoLogger{cfg.logger}),
	}
	kopts = append(kopts, cfg.group.kgoOpts()...)
	kopts = append(kopts, cfg.kgoOpts...)
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new consumer client: %w", err)
	}
	c.cl = cl
	c.adm = kadm.NewClient(cl)
	return c, nil
}

func (c *Consumer) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range assigned {
		for _, p := range ps {
			c.gen++
			c.parts[topicPartition{t, p}] = &partState{
				gen: c.gen, next: -1, committed: -1, rewindTo: -1, cursor: -1,
				acked: make(map[int64]bool), attempts: make(map[int64]int),
			}
		}
	}
	c.logger.Info("kafka: partitions assigned", "partitions", assigned)
}

// onRevoked commits the acked prefix of the revoked partitions, then
// forgets them: acks that arrive later are ignored, and the next owner
// redelivers from the committed offset (duplicates, never losses).
func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.commitLocked(ctx, revoked)
	c.drop(revoked)
	c.logger.InfoContext(ctx, "kafka: partitions revoked", "partitions", revoked)
}

// onLost forgets partitions without committing: the group generation is
// gone, a commit would be rejected.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.drop(lost)
	c.logger.Warn("kafka: partitions lost", "partitions", lost)
}

func (c *Consumer) drop(tps map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range tps {
		for _, p := range ps {
			delete(c.parts, topicPartition{t, p})
		}
	}
}

// Commit commits every owned partition's acked prefix now. Consume also
// does it every commit interval, on revoke and on shutdown.
func (c *Consumer) Commit(ctx context.Context) error {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	return c.commitLocked(ctx, nil)
}

// commitLocked commits the partitions in only (all owned when nil).
func (c *Consumer) commitLocked(ctx context.Context, only map[string][]int32) error {
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	c.mu.Lock()
	for tp, s := range c.parts {
		if only != nil && !contains(only[tp.topic], tp.partition) {
			continue
		}
		cp := s.commitPoint()
		if cp < 0 || cp <= s.committed {
			continue
		}
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: cp}
	}
	c.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
					cerr = errors.Join(cerr, fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, e))
					continue
				}
				if s := c.parts[topicPartition{t.Topic, p.Partition}]; s != nil {
					s.committed = max(s.committed, offsets[t.Topic][p.Partition].Offset)
				}
			}
		}
	})
	if cerr != nil {
		c.mu.Lock()
		c.commitErrs++
		c.mu.Unlock()
		return fmt.Errorf("kafka: commit offsets: %w", cerr)
	}
	return nil
}

func contains(ps []int32, p int32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// Consume polls the group's partitions and calls handle for each record,
// from this goroutine, in partition order. It returns nil after ctx is
// cancelled (or Close is called), once the acked prefixes were committed;
// Close then leaves the group. handle may block for back-pressure but must
// return once its ctx is done, or Consume (and Close) cannot return.
// Fetch errors are logged and retried by franz-go; Consume does not
// return on them.
func (c *Consumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	ctx, end, err := c.run.Begin(ctx, ErrConsumerClosed, ErrConsuming)
	if err != nil {
		return err
	}
	defer end()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.commitLoop(ctx)
	}()
	defer wg.Wait()

	for {
		pollCtx, wake := context.WithCancel(ctx)
		c.mu.Lock()
		c.wakePoll = wake
		due := c.hasDueRewindLocked(time.Now())
		c.mu.Unlock()
		if due {
			wake()
		}
		fetches := c.cl.PollRecords(pollCtx, c.cfg.maxPollRecords)
		wake()
		if fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			c.logger.WarnContext(ctx, "kafka: fetch error", "topic", t, "partition", p, logattr.Err(err))
		})
		fetches.EachRecord(func(r *kgo.Record) {
			if ctx.Err() != nil {
				// Not delivered: not in pending, so never committed past.
				return
			}
			if d := c.delivery(r); d != nil {
				handle(ctx, d)
			}
		})
		c.applyRewinds(time.Now())
		c.cl.AllowRebalance()
		if ctx.Err() != nil {
			fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.Commit(fctx)
			cancel()
			if err != nil {
				c.logger.WarnContext(ctx, "kafka: final commit", logattr.Err(err))
			}
			return nil
		}
	}
}

func (c *Consumer) commitLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.Commit(ctx); err != nil && ctx.Err() == nil {
				c.logger.WarnContext(ctx, "kafka: periodic commit", logattr.Err(err))
			}
		}
	}
}

// delivery registers r as delivered and builds its Delivery; nil when the
// partition is no longer owned (revoked between fetch and hand-over).
func (c *Consumer) delivery(r *kgo.Record) *broker.Delivery {
	tp := topicPartition{r.Topic, r.Partition}
	c.mu.Lock()
	s := c.parts[tp]
	if s == nil {
		c.mu.Unlock()
		return nil
	}
	if r.Offset >= s.next {
		s.pending = append(s.pending, r.Offset)
		s.next = r.Offset + 1
	}
	s.cursor = r.Offset + 1
	s.attempts[r.Offset]++
	attempt := s.attempts[r.Offset]
	gen := s.gen
	c.mu.Unlock()

	// Record headers may repeat a key: a repeated ce_ attribute is
	// ambiguous and DecodeMulti refuses it, naming the attribute.
	multi := make(map[string][]string, len(r.Headers))
	for _, h := range r.Headers {
		multi[h.Key] = append(multi[h.Key], string(h.Value))
	}
	ev, headers, err := cloudevents.DecodeMulti(cloudevents.Kafka, multi, r.Value)
	d := &broker.Delivery{
		Raw: broker.RawMessage{
			Destination: r.Topic,
			Key:         string(r.Key),
			Headers:     headers,
			Body:        r.Value,
		},
		Attempt: attempt,
	}
	if err != nil {
		d.DecodeErr = fmt.Errorf("kafka: decode %s[%d]@%d: %w", r.Topic, r.Partition, r.Offset, err)
	} else {
		ev.Topic = r.Topic
		d.Event = ev
	}
	var once sync.Mutex
	settled := false
	settle := func() bool {
		once.Lock()
		defer once.Unlock()
		if settled {
			return false
		}
		settled = true
		return true
	}
	offset := r.Offset
	d.Ack = func(context.Context) error {
		if !settle() {
			return ErrSettled
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if s := c.parts[tp]; s != nil && s.gen == gen {
			s.acked[offset] = true
		}
		return nil
	}
	d.Nack = func(_ context.Context, delay time.Duration) error {
		if !settle() {
			return ErrSettled
		}
		c.nack(tp, gen, offset, max(delay, 0))
		return nil
	}
	return d
}

// nack schedules a rewind of the partition to offset after delay. The
// Consume loop applies it between polls (SetOffsets), so the partition is
// refetched from the nacked record: it and every later record are handed
// to handle again in partition order. Later records that were already
// acked stay acked (their redelivery is a duplicate the inbox absorbs).
func (c *Consumer) nack(tp topicPartition, gen uint64, offset int64, delay time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.parts[tp]
	if s == nil || s.gen != gen || s.acked[offset] {
		// Revoked: the next owner redelivers from the committed offset,
		// which is at or before this record. Acked by an earlier
		// delivery: the effect is committed, nothing to redo.
		return
	}
	due := time.Now().Add(delay)
	if s.rewindTo < 0 || offset < s.rewindTo {
		s.rewindTo = offset
	}
	if s.rewindDue.IsZero() || due.Before(s.rewindDue) {
		s.rewindDue = due
	}
	// Wake the poll when the rewind is due (nothing to wake unless a
	// Consume runs; the next one applies due rewinds before polling).
	c.run.AfterFunc(delay, func() {
		c.mu.Lock()
		wake := c.wakePoll
		c.mu.Unlock()
		if wake != nil {
			wake()
		}
	})
}

func (c *Consumer) hasDueRewindLocked(now time.Time) bool {
	for _, s := range c.parts {
		if s.rewindTo >= 0 && !now.Before(s.rewindDue) {
			return true
		}
	}
	return false
}

// applyRewinds runs on the polling goroutine while rebalances are blocked,
// as SetOffsets requires.
func (c *Consumer) applyRewinds(now time.Time) {
	set := make(map[string]map[int32]kgo.EpochOffset)
	c.mu.Lock()
	for tp, s := range c.parts {
		if s.rewindTo < 0 || now.Before(s.rewindDue) {
			continue
		}
		to := s.rewindTo
		s.rewindTo, s.rewindDue = -1, time.Time{}
		if s.cursor >= 0 && to >= s.cursor {
			// An earlier rewind (or the fetch position) is already at or
			// before it: seeking to it would skip the records in between,
			// which were nacked or not yet delivered (a nack of a copy
			// delivered before that rewind, arriving after it).
			continue
		}
		if set[tp.topic] == nil {
			set[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		set[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: to}
		s.cursor = to
	}
	c.mu.Unlock()
	if len(set) > 0 {
		c.cl.SetOffsets(set)
	}
}

// Lag is the consumer group's lag: per partition, the log end offset minus
// the committed offset (what a restart would have to re-read).
type Lag struct {
	Total      int64
	Partitions map[string]map[int32]int64
}

// Lag asks the cluster for the group's committed offsets and the log end
// offsets. It is meant for a metrics collector, not the hot path.
func (c *Consumer) Lag(ctx context.Context) (Lag, error) {
	lags, err := c.adm.Lag(ctx, c.group)
	if err != nil {
		return Lag{}, fmt.Errorf("kafka: lag: %w", err)
	}
	g, ok := lags[c.group]
	if !ok {
		return Lag{}, fmt.Errorf("kafka: lag: group %s not described", c.group)
	}
	if err := g.Error(); err != nil {
		return Lag{}, fmt.Errorf("kafka: lag: %w", err)
	}
	out := Lag{Partitions: make(map[string]map[int32]int64)}
	for t, ps := range g.Lag {
		out.Partitions[t] = make(map[int32]int64, len(ps))
		for p, l := range ps {
			out.Partitions[t][p] = l.Lag
			if l.Lag > 0 {
				out.Total += l.Lag
			}
		}
	}
	return out, nil
}

// Close stops a running Consume (which commits the acked prefixes), leaves
// the group and closes the connections. It is safe to call twice. A static
// member ([WithInstanceID]) does not leave: its partitions wait for it to
// come back under the same id, or for its session timeout.
func (c *Consumer) Close() error {
	if c.run.Close() {
		c.cl.Close()
	}
	return nil
}
