package kafka

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Defaults.
const (
	// DefaultSource is the CloudEvents "source" attribute when none is set.
	DefaultSource = "ferry"
	// DefaultDeliveryTimeout bounds how long franz-go keeps an unsendable
	// record buffered (kgo.RecordDeliveryTimeout). With the idempotent
	// producer franz-go only enforces it when failing the record is safe
	// (never sent, or answered), so it never creates a hidden duplicate.
	DefaultDeliveryTimeout = 30 * time.Second
	// DefaultCommitInterval is how often the consumer commits the acked
	// prefix of each partition.
	DefaultCommitInterval = time.Second
	// DefaultMaxPollRecords bounds one poll, and so how many records of a
	// partition can be handed to handle before the next rebalance point.
	DefaultMaxPollRecords = 500
	// DefaultMaxRecordBytes is the largest record the publisher sends,
	// just under Kafka's default message.max.bytes (1 MiB + 12) and
	// franz-go's default batch limit. Checked before sending, so a too
	// large event fails alone (ClassPermanent) and holds back only the
	// later events of its aggregate.
	DefaultMaxRecordBytes = 1_000_000
)

// Option configures a Publisher or a Consumer. Options that only make sense
// for one role say so and are ignored by the other.
type Option func(*config)

type config struct {
	source          string
	logger          *slog.Logger
	kgoOpts         []kgo.Opt
	deliveryTimeout time.Duration
	commitInterval  time.Duration
	maxPollRecords  int
	clientID        string
	maxRecordBytes  int
	group           groupConfig // consumer group membership (group.go)
}

func newConfig(opts []Option) (config, error) {
	c := config{
		source:          DefaultSource,
		deliveryTimeout: DefaultDeliveryTimeout,
		commitInterval:  DefaultCommitInterval,
		maxPollRecords:  DefaultMaxPollRecords,
		clientID:        "ferry",
		maxRecordBytes:  DefaultMaxRecordBytes,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.source == "":
		return c, &ferry.ConfigError{Field: "kafka.source", Reason: "must not be empty"}
	case c.deliveryTimeout <= 0:
		return c, &ferry.ConfigError{Field: "kafka.delivery_timeout", Reason: fmt.Sprintf("must be > 0, got %s", c.deliveryTimeout)}
	case c.commitInterval <= 0:
		return c, &ferry.ConfigError{Field: "kafka.commit_interval", Reason: fmt.Sprintf("must be > 0, got %s", c.commitInterval)}
	case c.maxRecordBytes < 1:
		return c, &ferry.ConfigError{Field: "kafka.max_record_bytes", Reason: fmt.Sprintf("must be >= 1, got %d", c.maxRecordBytes)}
	case c.maxPollRecords < 1 || c.maxPollRecords > 100000:
		return c, &ferry.ConfigError{Field: "kafka.max_poll_records", Reason: fmt.Sprintf("must be in [1, 100000], got %d", c.maxPollRecords)}
	}
	c.logger = logattr.OrDefault(c.logger)
	return c, nil
}

// WithSource sets the CloudEvents "source" attribute of published events
// (publisher only). Default "ferry".
func WithSource(source string) Option { return func(c *config) { c.source = source } }

// WithLogger sets the structured logger (franz-go's warnings and errors go
// to it too). Without it (or with nil) the client logs to slog.Default()
// as it is when the publisher or consumer is built, like every Ferry
// component; pass slog.New(slog.DiscardHandler) to silence it. Logs carry
// ids, never payloads.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithClientID sets the Kafka client id (visible in broker logs and quotas).
func WithClientID(id string) Option { return func(c *config) { c.clientID = id } }

// WithKgoOpts appends raw franz-go options (TLS, SASL, linger, …). They are
// applied after Ferry's own, so they can override them; overriding the
// durability settings (RequiredAcks, idempotency) voids the guarantees
// documented in the package doc.
func WithKgoOpts(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) }
}

// WithDeliveryTimeout bounds how long a record may stay buffered in the
// producer before it fails (publisher only). Default 30s.
func WithDeliveryTimeout(d time.Duration) Option {
	return func(c *config) { c.deliveryTimeout = d }
}

// WithCommitInterval sets how often the consumer commits each partition's
// acked prefix (consumer only). Default 1s. Offsets are also committed on
// revoke and on shutdown; a shorter interval means fewer redeliveries after
// a crash, at the cost of more commit requests.
func WithCommitInterval(d time.Duration) Option {
	return func(c *config) { c.commitInterval = d }
}

// WithMaxPollRecords bounds the records fetched per poll (consumer only).
// Default 500.
func WithMaxPollRecords(n int) Option { return func(c *config) { c.maxPollRecords = n } }

// WithMaxRecordBytes sets the largest record (key + value + headers) the
// publisher sends (publisher only); set it to the topics'
// max.message.bytes. Default 1,000,000. Raising it above franz-go's
// ProducerBatchMaxBytes also needs that raised (WithKgoOpts).
func WithMaxRecordBytes(n int) Option { return func(c *config) { c.maxRecordBytes = n } }
