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

// Render substitutes the placeholders. It runs once per written event, so
// it scans the template directly instead of building a strings.Replacer.
func (t TopicTemplate) Render(e *Event) string {
	if t == "" || t == DefaultTopicTemplate {
		return e.AggregateType + ".events"
	}
	s := string(t)
	var b strings.Builder
	b.Grow(len(s) + len(e.AggregateType) + len(e.TenantID))
	for {
		open := strings.IndexByte(s, '{')
		if open < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:open])
		s = s[open:]
		switch {
		case strings.HasPrefix(s, "{tenant_id}"):
			b.WriteString(e.TenantID)
			s = s[len("{tenant_id}"):]
		case strings.HasPrefix(s, "{aggregate_type}"):
			b.WriteString(e.AggregateType)
			s = s[len("{aggregate_type}"):]
		case strings.HasPrefix(s, "{event_type}"):
			b.WriteString(e.EventType)
			s = s[len("{event_type}"):]
		default: // unknown placeholder: kept literally (Check rejects such templates)
			b.WriteByte('{')
			s = s[1:]
		}
	}
}

// Topic renders the topic of e (the event at index idx of a call) and
// checks it against the strictest broker's rules (Kafka's characters and
// 249 bytes): a template of valid parts can still render a topic that is
// too long.
func (t TopicTemplate) Topic(idx int, e *Event) (string, error) {
	topic := t.Render(e)
	if err := validateTopic(idx, topic); err != nil {
		return "", err
	}
	return topic, nil
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
