package shadow

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrNoTopic is returned when a Kafka topic to compare does not exist.
var ErrNoTopic = errors.New("shadow: topic does not exist")

// KafkaReader is a [Reader] over one Kafka topic: every partition from the
// first offset at or after since (the start when since is zero) to its last
// stable offset when the read began (committed records only: an open
// transaction's records and everything after them are not read). It uses a
// direct-partition client with no consumer group: nothing is committed or
// changed, and no consumer of the topic sees a difference.
//
// Messages are ordered by record timestamp, then partition and offset; Seq
// is the offset. Ordering across partitions is only as good as the
// producers' clocks, so each message's Scope is its record key (the
// partitioning key: Ferry keys by aggregate) or, for a record without a key,
// its partition — [Compare] checks order within a scope only.
type KafkaReader struct {
	Seeds []string // host:port of one or more brokers
	Topic string
}

// Read implements [Reader].
func (r KafkaReader) Read(ctx context.Context, since time.Time) ([]Message, error) {
	if r.Topic == "" {
		return nil, errors.New("shadow: kafka: topic must not be empty")
	}
	if len(r.Seeds) == 0 {
		return nil, errors.New("shadow: kafka: no seed brokers")
	}
	want, end, err := r.bounds(ctx, since)
	if err != nil || len(want) == 0 {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.Seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.Topic: want}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers occupy offsets; keeping them lets a partition
		// whose last offset before the bound is a marker reach the bound.
		kgo.KeepControlRecords())
	if err != nil {
		return nil, fmt.Errorf("shadow: kafka: %w", err)
	}
	defer cl.Close()
	type rec struct {
		part int32
		ts   time.Time
		m    Message
	}
	var recs []rec
	for len(end) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("shadow: topic %s: %w", r.Topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return nil, fmt.Errorf("shadow: topic %s: fetch: %w", r.Topic, ferr)
		}
		fs.EachRecord(func(kr *kgo.Record) {
			e, ok := end[kr.Partition]
			if !ok || kr.Offset >= e {
				return
			}
			if kr.Offset+1 >= e {
				delete(end, kr.Partition)
			}
			if kr.Attrs.IsControl() {
				return
			}
			h := map[string]string{}
			for _, x := range kr.Headers {
				if _, dup := h[x.Key]; !dup {
					h[x.Key] = string(x.Value)
				}
			}
			scope := "partition " + strconv.Itoa(int(kr.Partition))
			if kr.Key != nil {
				scope = "key " + string(kr.Key)
			}
			recs = append(recs, rec{part: kr.Partition, ts: kr.Timestamp, m: Message{Seq: uint64(kr.Offset), Scope: scope, Headers: h, Body: kr.Value}})
		})
	}
	sort.SliceStable(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if !a.ts.Equal(b.ts) {
			return a.ts.Before(b.ts)
		}
		if a.part != b.part {
			return a.part < b.part
		}
		return a.m.Seq < b.m.Seq
	})
	out := make([]Message, len(recs))
	for i, x := range recs {
		out[i] = x.m
	}
	return out, nil
}

// bounds lists, per partition with something to read, the offset to start
// at and the last stable offset to stop before.
func (r KafkaReader) bounds(ctx context.Context, since time.Time) (map[int32]kgo.Offset, map[int32]int64, error) {
	adm, err := kgo.NewClient(kgo.SeedBrokers(r.Seeds...))
	if err != nil {
		return nil, nil, fmt.Errorf("shadow: kafka: %w", err)
	}
	defer adm.Close()
	ac := kadm.NewClient(adm)
	ends, err := ac.ListCommittedOffsets(ctx, r.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("shadow: topic %s: end offsets: %w", r.Topic, err)
	}
	if err := ends.Error(); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, nil, fmt.Errorf("shadow: topic %s: %w: %w", r.Topic, ErrNoTopic, err)
		}
		return nil, nil, fmt.Errorf("shadow: topic %s: end offsets: %w", r.Topic, err)
	}
	var starts kadm.ListedOffsets
	if since.IsZero() {
		starts, err = ac.ListStartOffsets(ctx, r.Topic)
	} else {
		starts, err = ac.ListOffsetsAfterMilli(ctx, since.UnixMilli(), r.Topic)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("shadow: topic %s: start offsets: %w", r.Topic, err)
	}
	if err := starts.Error(); err != nil {
		return nil, nil, fmt.Errorf("shadow: topic %s: start offsets: %w", r.Topic, err)
	}
	want := map[int32]kgo.Offset{}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		from := int64(0)
		if s, ok := starts.Lookup(r.Topic, o.Partition); ok {
			from = s.Offset
		}
		if from < o.Offset {
			want[o.Partition] = kgo.NewOffset().At(from)
			end[o.Partition] = o.Offset
		}
	})
	return want, end, nil
}
