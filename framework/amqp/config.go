package amqp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// Defaults of Config.
const (
	// DefaultPrefetch is how many unacknowledged messages RabbitMQ sends to
	// each subscription ahead of those it handed out (its consumer's
	// concurrency). It buffers; it adds no parallelism.
	DefaultPrefetch = 4
	// DefaultChannelPoolSize is how many channels the publisher keeps open.
	DefaultChannelPoolSize = 8
	// DefaultNackDelay is the first pause before a nacked message goes
	// back to its queue.
	DefaultNackDelay = 500 * time.Millisecond
	// DefaultMaxNackDelay caps the pause, which doubles with each
	// consecutive nack of a subscription.
	DefaultMaxNackDelay = 30 * time.Second
	// DefaultConnectInterval is the first pause between two attempts to
	// connect at start.
	DefaultConnectInterval = 250 * time.Millisecond
	// DefaultMaxConnectInterval caps that pause.
	DefaultMaxConnectInterval = 5 * time.Second
)

// TransportConfig configures a Transport: its connection, publisher and
// subscribers.
type TransportConfig struct {
	// URL is the broker's address, e.g.
	// amqp://guest:guest@127.0.0.1:5672/. Required.
	URL string
	// Prefetch is how many messages each subscription buffers beyond those
	// it handed out: its Qos prefetch count is the consumer's concurrency
	// plus Prefetch. Defaults to DefaultPrefetch.
	Prefetch int
	// ChannelPoolSize is how many channels the publisher keeps open.
	// Defaults to DefaultChannelPoolSize.
	ChannelPoolSize int
	// NackDelay is the first pause before a nacked message is requeued,
	// so that a failing message does not loop hot. It doubles with each
	// consecutive nack on a subscription, up to MaxNackDelay, and resets
	// on an ack. Defaults to DefaultNackDelay.
	NackDelay time.Duration
	// MaxNackDelay caps NackDelay's growth. Defaults to
	// DefaultMaxNackDelay.
	MaxNackDelay time.Duration
	// ConnectInterval is the first pause between attempts to connect when
	// the broker is down at start; it doubles up to MaxConnectInterval.
	// Defaults to DefaultConnectInterval.
	ConnectInterval time.Duration
	// MaxConnectInterval caps ConnectInterval's growth. Defaults to
	// DefaultMaxConnectInterval.
	MaxConnectInterval time.Duration
	// QueueArguments are the arguments of every consumer queue, e.g.
	// {"x-queue-type": "quorum"}. RabbitMQ refuses to redeclare an
	// existing queue with other arguments. Defaults to none (a classic
	// queue).
	QueueArguments amqp091.Table
	// Logger receives the transport's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c TransportConfig) WithDefaults() TransportConfig {
	c.Prefetch = cmp.Or(c.Prefetch, DefaultPrefetch)
	c.ChannelPoolSize = cmp.Or(c.ChannelPoolSize, DefaultChannelPoolSize)
	c.NackDelay = cmp.Or(c.NackDelay, DefaultNackDelay)
	c.MaxNackDelay = cmp.Or(c.MaxNackDelay, max(DefaultMaxNackDelay, c.NackDelay))
	c.ConnectInterval = cmp.Or(c.ConnectInterval, DefaultConnectInterval)
	c.MaxConnectInterval = cmp.Or(c.MaxConnectInterval, max(DefaultMaxConnectInterval, c.ConnectInterval))
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ErrMissingURL is returned for a Config without a URL.
var ErrMissingURL = errors.New("amqp: missing URL (e.g. amqp://guest:guest@127.0.0.1:5672/)")

// Validate reports the first invalid field of c.
func (c TransportConfig) Validate() error {
	switch {
	case c.URL == "":
		return ErrMissingURL
	case !strings.HasPrefix(c.URL, "amqp://") && !strings.HasPrefix(c.URL, "amqps://"):
		return fmt.Errorf("amqp: URL must start with amqp:// or amqps://, got %q", redact(c.URL))
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return fmt.Errorf("amqp: Prefetch must be between 1 and 65535, got %d", c.Prefetch)
	case c.ChannelPoolSize < 1:
		return fmt.Errorf("amqp: ChannelPoolSize must be at least 1, got %d", c.ChannelPoolSize)
	case c.NackDelay < 0 || c.MaxNackDelay < c.NackDelay:
		return fmt.Errorf("amqp: want 0 <= NackDelay (%s) <= MaxNackDelay (%s)", c.NackDelay, c.MaxNackDelay)
	case c.ConnectInterval <= 0 || c.MaxConnectInterval < c.ConnectInterval:
		return fmt.Errorf("amqp: want 0 < ConnectInterval (%s) <= MaxConnectInterval (%s)", c.ConnectInterval, c.MaxConnectInterval)
	}
	return nil
}

// redact hides the password of an AMQP URL.
func redact(u string) string {
	uri, err := amqp091.ParseURI(u)
	if err != nil || uri.Password == "" {
		return u
	}
	return strings.Replace(u, ":"+uri.Password+"@", ":xxxxx@", 1)
}
