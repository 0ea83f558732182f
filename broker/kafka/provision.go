package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry"
)

// ErrTopicMissing: a destination topic does not exist. The relay refuses to
// start on it unless asked to provision (EnsureTopics). Errors matching it
// are *MissingTopicsError.
var ErrTopicMissing = errors.New("kafka: topic missing")

// MissingTopicsError names every missing topic, sorted.
type MissingTopicsError struct{ Topics []string }

func (e *MissingTopicsError) Error() string {
	return fmt.Sprintf("%v: %v (create them, or run the relay with --provision)", ErrTopicMissing, e.Topics)
}

// Is reports ErrTopicMissing.
func (e *MissingTopicsError) Is(target error) bool { return target == ErrTopicMissing }

// RecommendedReplication is the replication factor production topics should
// have: with min.insync.replicas=2 and acks=all, one broker can fail without
// losing acknowledged records or stopping writes.
const RecommendedReplication = 3

// TopicStatus is what CheckTopics found about one topic. The durability
// fields are read from the topic's effective configuration; empty when the
// broker does not report them (then Unread names them: kfake, for one,
// reports fewer configs than Kafka).
type TopicStatus struct {
	Topic                 string
	Partitions            int
	ReplicationFactor     int
	MinInsyncReplicas     string // min.insync.replicas
	UncleanLeaderElection string // unclean.leader.election.enable
	DurabilityWarnings    []string
	// Unread lists the durability settings the broker did not report
	// (or could not be asked for), so they could not be checked.
	Unread []string
}

// EnsureTopics creates the topics that do not exist yet with the given
// partition count and replication factor (see RecommendedReplication), and
// min.insync.replicas = min(2, replication). Existing topics are left as
// they are: changing the partition count of a live topic moves aggregates
// to other partitions and breaks per-aggregate order, so it is never done
// implicitly.
func EnsureTopics(ctx context.Context, adm *kadm.Client, topics []string, partitions int32, replication int16) error {
	if partitions < 1 {
		return &ferry.ConfigError{Field: "kafka.partitions", Reason: fmt.Sprintf("must be >= 1, got %d", partitions)}
	}
	if replication < 1 {
		return &ferry.ConfigError{Field: "kafka.replication", Reason: fmt.Sprintf("must be >= 1, got %d", replication)}
	}
	if len(topics) == 0 {
		return nil
	}
	// Create only what is missing: asking to create an existing topic is
	// answered TOPIC_ALREADY_EXISTS by Kafka, but some implementations
	// mishandle mixed requests, and a listing first keeps the request small.
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("kafka: list topics: %w", err)
	}
	var missing []string
	for _, t := range topics {
		if d, ok := details[t]; !ok || d.Err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	topics = missing
	minISR := strconv.Itoa(int(min(replication, 2)))
	unclean := "false"
	resps, err := adm.CreateTopics(ctx, partitions, replication, map[string]*string{
		"min.insync.replicas":            &minISR,
		"unclean.leader.election.enable": &unclean,
	}, topics...)
	if err != nil {
		return fmt.Errorf("kafka: create topics: %w", err)
	}
	var errs []error
	for _, t := range topics {
		r, ok := resps[t]
		if !ok {
			errs = append(errs, fmt.Errorf("kafka: create topic %s: no answer", t))
			continue
		}
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("kafka: create topic %s: %w", t, r.Err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return waitVisible(ctx, adm, topics)
}

// waitVisible waits until metadata shows every topic: creation propagates
// to brokers (and to the client's metadata cache) asynchronously, and a
// check right after creating must not report the topic missing.
func waitVisible(ctx context.Context, adm *kadm.Client, topics []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		details, err := adm.ListTopics(ctx, topics...)
		if err == nil {
			ok := true
			for _, t := range topics {
				if d, found := details[t]; !found || d.Err != nil || len(d.Partitions) == 0 {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka: created topics %v not visible in metadata: %w", topics, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CheckTopics reports each topic's partitions, replication and durability
// settings, and returns an error wrapping ErrTopicMissing naming every
// missing topic. Durability shortfalls (replication below
// RecommendedReplication, min.insync.replicas below 2, unclean leader
// election on) are reported as warnings in TopicStatus, not as errors:
// single-broker development clusters are legitimate.
func CheckTopics(ctx context.Context, adm *kadm.Client, topics []string) ([]TopicStatus, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("kafka: list topics: %w", err)
	}
	var missing []string
	var present []string
	out := make([]TopicStatus, 0, len(topics))
	for _, t := range topics {
		d, ok := details[t]
		if !ok || d.Err != nil {
			missing = append(missing, t)
			continue
		}
		present = append(present, t)
		st := TopicStatus{Topic: t, Partitions: len(d.Partitions)}
		for _, p := range d.Partitions {
			st.ReplicationFactor = max(st.ReplicationFactor, len(p.Replicas))
		}
		out = append(out, st)
	}
	if len(present) > 0 {
		cfgs, err := adm.DescribeTopicConfigs(ctx, present...)
		if err == nil {
			for i := range out {
				rc, err := cfgs.On(out[i].Topic, nil)
				if err != nil || rc.Err != nil {
					continue
				}
				for _, c := range rc.Configs {
					if c.Value == nil {
						continue
					}
					switch c.Key {
					case "min.insync.replicas":
						out[i].MinInsyncReplicas = *c.Value
					case "unclean.leader.election.enable":
						out[i].UncleanLeaderElection = *c.Value
					}
				}
			}
		}
	}
	for i := range out {
		if out[i].MinInsyncReplicas == "" {
			out[i].Unread = append(out[i].Unread, "min.insync.replicas")
		}
		if out[i].UncleanLeaderElection == "" {
			out[i].Unread = append(out[i].Unread, "unclean.leader.election.enable")
		}
		out[i].DurabilityWarnings = durabilityWarnings(out[i])
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return out, &MissingTopicsError{Topics: missing}
	}
	return out, nil
}

func durabilityWarnings(s TopicStatus) []string {
	var w []string
	if s.ReplicationFactor < RecommendedReplication {
		w = append(w, fmt.Sprintf("replication factor %d < %d: a broker loss can lose acknowledged records", s.ReplicationFactor, RecommendedReplication))
	}
	if n, err := strconv.Atoi(s.MinInsyncReplicas); err == nil && n < 2 && s.ReplicationFactor > 1 {
		w = append(w, fmt.Sprintf("min.insync.replicas=%d: acks=all is satisfied by the leader alone", n))
	}
	if s.UncleanLeaderElection == "true" {
		w = append(w, "unclean.leader.election.enable=true: an out-of-sync replica may become leader and drop acknowledged records")
	}
	return w
}
