package rabbitmq

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Defaults.
const (
	// DefaultExchange is the durable topic exchange events are published to.
	DefaultExchange = "ferry"
	// DefaultSource is the CloudEvents "source" attribute when none is set.
	DefaultSource = "ferry"
	// DefaultPrefetch is the consumer's Qos prefetch count: how many
	// unacked deliveries the broker hands one consumer at a time.
	DefaultPrefetch = 256
	// DefaultDialTimeout bounds one connection attempt.
	DefaultDialTimeout = 5 * time.Second
	// DefaultMaxMessageBytes is RabbitMQ 4's default max_message_size
	// (16 MiB). Larger messages are refused before sending (ClassPermanent):
	// the broker would close the whole channel instead, failing the other
	// messages in flight with it.
	DefaultMaxMessageBytes = 16 << 20
	// DefaultReconnectDelay is the consumer's first wait before
	// reconnecting; it doubles up to a minute.
	DefaultReconnectDelay = 250 * time.Millisecond
)

// Option configures a Publisher or a Consumer; options that apply to one
// role only say so.
type Option func(*config)

type config struct {
	exchange       string
	source         string
	prefetch       int
	dialTimeout    time.Duration
	reconnectDelay time.Duration
	consumerTag    string
	maxMessage     int
	logger         *slog.Logger
}

func newConfig(opts []Option) (config, error) {
	c := config{
		exchange:       DefaultExchange,
		source:         DefaultSource,
		prefetch:       DefaultPrefetch,
		dialTimeout:    DefaultDialTimeout,
		reconnectDelay: DefaultReconnectDelay,
		maxMessage:     DefaultMaxMessageBytes,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.source == "":
		return c, &ferry.ConfigError{Field: "rabbitmq.source", Reason: "must not be empty"}
	case len(c.exchange) > 255:
		return c, &ferry.ConfigError{Field: "rabbitmq.exchange", Reason: fmt.Sprintf("at most 255 bytes, got %d", len(c.exchange))}
	case c.prefetch < 1 || c.prefetch > 65535:
		return c, &ferry.ConfigError{Field: "rabbitmq.prefetch", Reason: fmt.Sprintf("must be in [1, 65535], got %d", c.prefetch)}
	case c.maxMessage < 1:
		return c, &ferry.ConfigError{Field: "rabbitmq.max_message_bytes", Reason: fmt.Sprintf("must be >= 1, got %d", c.maxMessage)}
	case c.dialTimeout <= 0:
		return c, &ferry.ConfigError{Field: "rabbitmq.dial_timeout", Reason: "must be > 0"}
	case c.reconnectDelay <= 0:
		return c, &ferry.ConfigError{Field: "rabbitmq.reconnect_delay", Reason: "must be > 0"}
	}
	c.logger = logattr.OrDefault(c.logger)
	return c, nil
}

// WithExchange sets the exchange events are published to (publisher only).
// Default "ferry", a durable topic exchange (see EnsureTopology). The
// routing key is always the event's Topic. The empty string is the default
// exchange, which routes by queue name.
func WithExchange(name string) Option { return func(c *config) { c.exchange = name } }

// WithSource sets the CloudEvents "source" attribute (publisher only).
func WithSource(source string) Option { return func(c *config) { c.source = source } }

// WithPrefetch sets the consumer's Qos prefetch count (consumer only).
// It bounds the unacked deliveries in flight, including those waiting out
// a Nack delay. Default 256.
func WithPrefetch(n int) Option { return func(c *config) { c.prefetch = n } }

// WithDialTimeout bounds one connection attempt. Default 5s.
func WithDialTimeout(d time.Duration) Option { return func(c *config) { c.dialTimeout = d } }

// WithReconnectDelay sets the consumer's first reconnect wait (doubling up
// to a minute). Default 250ms.
func WithReconnectDelay(d time.Duration) Option { return func(c *config) { c.reconnectDelay = d } }

// WithConsumerTag sets the AMQP consumer tag (consumer only); default a
// broker-generated one.
func WithConsumerTag(tag string) Option { return func(c *config) { c.consumerTag = tag } }

// WithLogger sets the structured logger. Without it (or with nil) the
// client logs to slog.Default() as it is when the publisher or consumer is
// built, like every Ferry component; pass slog.New(slog.DiscardHandler)
// to silence it. Logs carry ids, never payloads or the URL's password.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithMaxMessageBytes sets the largest body the publisher sends; set it to
// the broker's max_message_size. Default 16 MiB.
func WithMaxMessageBytes(n int) Option { return func(c *config) { c.maxMessage = n } }
