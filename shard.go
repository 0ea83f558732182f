package ferry

import (
	"hash/fnv"
	"strings"
)

// DefaultShardCount is the number of shards when none is configured. Like
// Kafka partitions it is fixed per deployment: changing it needs a drain.
const DefaultShardCount = 16

// MaxShardCount bounds the shard count; each shard is a lease row.
const MaxShardCount = 4096

// ShardFor returns hash(tenant, aggregate_type, aggregate_id) mod n, using
// 32-bit FNV-1a over the three fields separated by NUL bytes (which no
// valid field contains). It is stable across versions: rows carry it.
func ShardFor(tenant, aggregateType, aggregateID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenant))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(aggregateType))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(aggregateID))
	return int(h.Sum32() % uint32(n))
}

// AggregateKey is the broker partition / ordering key for an aggregate.
func AggregateKey(tenant, aggregateType, aggregateID string) string {
	return tenant + "/" + aggregateType + "/" + aggregateID
}

// TopicTemplate renders a topic from an event. Placeholders:
// {tenant_id}, {aggregate_type}, {event_type}.
type TopicTemplate string

// DefaultTopicTemplate publishes each aggregate type to its own topic.
const DefaultTopicTemplate TopicTemplate = "{aggregate_type}.events"

// Render substitutes the placeholders.
func (t TopicTemplate) Render(e *Event) string {
	if t == "" {
		t = DefaultTopicTemplate
	}
	return strings.NewReplacer(
		"{tenant_id}", e.TenantID,
		"{aggregate_type}", e.AggregateType,
		"{event_type}", e.EventType,
	).Replace(string(t))
}

// Check rejects templates with unknown placeholders or characters a topic
// may not hold, so a typo fails at start instead of on the first event.
func (t TopicTemplate) Check() error {
	if t == "" {
		return nil
	}
	probe := t.Render(&Event{TenantID: "t", AggregateType: "a", EventType: "e"})
	if strings.ContainsAny(probe, "{}") {
		return &ConfigError{Field: "topic_template", Reason: "unknown placeholder; use {tenant_id}, {aggregate_type} or {event_type}"}
	}
	if !topicRE.MatchString(probe) || len(probe) > MaxTopicBytes {
		return &ConfigError{Field: "topic_template", Reason: "may contain only A-Z a-z 0-9 . _ - besides placeholders"}
	}
	return nil
}
