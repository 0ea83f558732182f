package ferry

import (
	"fmt"
	"regexp"
	"slices"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/sanitize"
)

// Default limits. They are deliberately small: an outbox row is a message,
// not a document store.
const (
	DefaultMaxPayloadBytes = 256 << 10
	DefaultMaxHeaderBytes  = 1024
	DefaultMaxIDBytes      = 128
	DefaultContentType     = "application/json"
)

// DefaultContentTypes are accepted unless Limits.ContentTypes says otherwise.
var defaultContentTypes = []string{
	"application/json",
	"application/cloudevents+json",
	"application/protobuf",
	"application/x-protobuf",
	"application/avro",
	"application/octet-stream",
	"text/plain",
	"application/vnd.ferry.encrypted",       // encrypt.ContentType: a Ferry envelope
	"application/vnd.ferry.claimcheck+json", // claimcheck.ContentType: a reference to an offloaded payload
}

// DefaultContentTypes returns the content types accepted by default.
func DefaultContentTypes() []string { return slices.Clone(defaultContentTypes) }

var (
	// tenant and aggregate type end up in topics and broker keys: keep them
	// to characters every broker accepts in names.
	tokenRE = regexp.MustCompile(`^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$`)
	// event types are dotted names, e.g. "order.created".
	eventTypeRE = regexp.MustCompile(`^[A-Za-z0-9_\-]+([.:/][A-Za-z0-9_\-]+)*$`)
	// topics: Kafka's legal characters, which NATS and AMQP also accept.
	topicRE = regexp.MustCompile(`^[A-Za-z0-9._\-]+$`)
	// W3C traceparent: version-traceid-parentid-flags.
	traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

// MaxTopicBytes is Kafka's topic name limit, the strictest of our brokers.
const MaxTopicBytes = 249

// Limits bounds what an event may hold. The zero value means the defaults.
type Limits struct {
	MaxPayloadBytes int      // default 256 KiB
	MaxHeaderBytes  int      // per header value; default 1 KiB
	MaxIDBytes      int      // tenant, aggregate type/id, event type; default 128
	ContentTypes    []string // default DefaultContentTypes()
}

func (l Limits) withDefaults() Limits {
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxIDBytes == 0 {
		l.MaxIDBytes = DefaultMaxIDBytes
	}
	if len(l.ContentTypes) == 0 {
		l.ContentTypes = defaultContentTypes
	}
	return l
}

// Check rejects limits that make no sense (negative sizes).
func (l Limits) Check() error {
	switch {
	case l.MaxPayloadBytes < 0:
		return &ConfigError{Field: "limits.max_payload_bytes", Reason: "must be >= 0 (0 means default)"}
	case l.MaxHeaderBytes < 0:
		return &ConfigError{Field: "limits.max_header_bytes", Reason: "must be >= 0 (0 means default)"}
	case l.MaxIDBytes < 0:
		return &ConfigError{Field: "limits.max_id_bytes", Reason: "must be >= 0 (0 means default)"}
	}
	return nil
}

// Validate checks e as the outbox writer will before writing anything.
// idx is the event's position in the call, used in the error. It checks
// only what the caller supplies; assigned fields (Shard) are ignored, and
// empty Topic, ContentType, ID and OccurredAt are allowed (they get defaults).
func (l Limits) Validate(idx int, e *Event) error {
	l = l.withDefaults()
	bad := func(field, format string, args ...any) error {
		return &ValidationError{Index: idx, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if e.ID != uuid.Nil && e.ID.Version() != 7 && e.ID.Version() != 4 {
		return bad("event_id", "must be a UUIDv7 (or v4), got version %d", e.ID.Version())
	}
	if err := l.checkName(idx, "tenant_id", e.TenantID, tokenRE); err != nil {
		return err
	}
	if err := l.checkName(idx, "aggregate_type", e.AggregateType, tokenRE); err != nil {
		return err
	}
	if err := l.checkText(idx, "aggregate_id", e.AggregateID, l.MaxIDBytes, true); err != nil {
		return err
	}
	if e.AggregateSeq < 0 {
		return bad("aggregate_seq", "must be >= 0 (0 allocates the next), got %d", e.AggregateSeq)
	}
	if err := l.checkName(idx, "event_type", e.EventType, eventTypeRE); err != nil {
		return err
	}
	if e.SchemaVersion < 1 {
		return bad("schema_version", "must be >= 1, got %d", e.SchemaVersion)
	}
	if e.ContentType != "" && !slices.Contains(l.ContentTypes, e.ContentType) {
		return bad("content_type", "%q is not one of the accepted content types %v", truncate(e.ContentType), l.ContentTypes)
	}
	if len(e.Payload) > l.MaxPayloadBytes {
		return bad("payload", "%d bytes exceeds the limit of %d bytes (send large data by reference)", len(e.Payload), l.MaxPayloadBytes)
	}
	if !e.OccurredAt.IsZero() && (e.OccurredAt.Year() < 2000 || e.OccurredAt.Year() > 9999) {
		return bad("occurred_at", "year %d is outside 2000..9999", e.OccurredAt.Year())
	}
	if e.Topic != "" {
		if err := validateTopic(idx, e.Topic); err != nil {
			return err
		}
	}
	h := e.Headers
	if h.Traceparent != "" && !traceparentRE.MatchString(h.Traceparent) {
		return bad("headers.traceparent", "%q is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", truncate(h.Traceparent))
	}
	for _, f := range []struct{ name, v string }{
		{"headers.correlation_id", h.CorrelationID},
		{"headers.causation_id", h.CausationID},
		{"headers.principal", h.Principal},
		{"headers.action", h.Action},
		{"headers.target", h.Target},
	} {
		if err := l.checkText(idx, f.name, f.v, l.MaxHeaderBytes, false); err != nil {
			return err
		}
	}
	return nil
}

// validateTopic checks a topic (given, or rendered from a template) against
// the strictest broker's rules: Kafka's characters and 249 bytes.
func validateTopic(idx int, topic string) error {
	if topic == "" {
		return &ValidationError{Index: idx, Field: "topic", Reason: "must not be empty"}
	}
	if len(topic) > MaxTopicBytes {
		return &ValidationError{Index: idx, Field: "topic", Reason: fmt.Sprintf("%d bytes exceeds the limit of %d bytes", len(topic), MaxTopicBytes)}
	}
	if !topicRE.MatchString(topic) {
		return &ValidationError{Index: idx, Field: "topic", Reason: fmt.Sprintf("%q may contain only A-Z a-z 0-9 . _ -", truncate(topic))}
	}
	return nil
}

func (l Limits) checkName(idx int, field, v string, re *regexp.Regexp) error {
	if v == "" {
		return &ValidationError{Index: idx, Field: field, Reason: "must not be empty"}
	}
	if len(v) > l.MaxIDBytes {
		return &ValidationError{Index: idx, Field: field, Reason: fmt.Sprintf("%d bytes exceeds the limit of %d bytes", len(v), l.MaxIDBytes)}
	}
	if !re.MatchString(v) {
		return &ValidationError{Index: idx, Field: field, Reason: fmt.Sprintf("%q may contain only A-Z a-z 0-9 _ - and single dots between them", truncate(v))}
	}
	return nil
}

func (l Limits) checkText(idx int, field, v string, max int, required bool) error {
	if v == "" {
		if required {
			return &ValidationError{Index: idx, Field: field, Reason: "must not be empty"}
		}
		return nil
	}
	if len(v) > max {
		return &ValidationError{Index: idx, Field: field, Reason: fmt.Sprintf("%d bytes exceeds the limit of %d bytes", len(v), max)}
	}
	if !utf8.ValidString(v) {
		return &ValidationError{Index: idx, Field: field, Reason: "must be valid UTF-8"}
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return &ValidationError{Index: idx, Field: field, Reason: "must not contain control characters"}
		}
	}
	return nil
}

// truncate keeps error messages short; it is applied only to names, never
// to payloads, which are not echoed at all.
func truncate(s string) string { return sanitize.Cut(s, 64) }
