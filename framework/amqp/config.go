package amqp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
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
	// DefaultMaxNackDelay caps the pause, which grows with the time a
	// subscription has been nacking without an ack.
	DefaultMaxNackDelay = 30 * time.Second
	// DefaultConnectInterval is the first pause between two attempts to
	// connect, at start and after the connection is lost.
	DefaultConnectInterval = 250 * time.Millisecond
	// DefaultMaxConnectInterval caps that pause: with the handshake's
	// bound (5 s unless the URL sets connection_timeout), consuming starts
	// again within 10 s of the broker's return, however long it was away.
	DefaultMaxConnectInterval = 3 * time.Second
	// DefaultDeliveryLimit is the x-delivery-limit of quorum queues: far
	// above any consumer's max_deliveries and the uncounted redeliveries a
	// message may see beside them (held at an open breaker, waiting for
	// its turn under strict order, nacked at shutdown), so that the
	// framework's own delivery limit dead-letters first and RabbitMQ, which
	// drops a message past its limit, never does.
	DefaultDeliveryLimit = 1_000_000
	// DefaultHeartbeat is the AMQP heartbeat proposed to the broker:
	// amqp091-go's own default.
	DefaultHeartbeat = 10 * time.Second
)

// The queue types of TransportConfig.QueueType.
const (
	// QueueClassic is RabbitMQ's classic queue, on one node.
	QueueClassic = "classic"
	// QueueQuorum is a quorum queue, replicated over a cluster's nodes
	// (x-queue-type quorum).
	QueueQuorum = "quorum"
)

// TransportConfig configures a Transport: its connection, publisher and
// subscribers.
type TransportConfig struct {
	// URL is the broker's address, e.g.
	// amqp://guest:guest@127.0.0.1:5672/, or the addresses of several
	// nodes of one cluster separated by commas, e.g.
	// amqp://app:pw@rabbit-1:5672/,amqp://app:pw@rabbit-2:5672/: the
	// connection goes to the first that answers, and when it is lost, to
	// the next that answers (see ParseURLs). Required.
	URL string
	// Prefetch is how many messages each subscription buffers beyond those
	// it handed out: its Qos prefetch count is the consumer's concurrency
	// plus Prefetch. Defaults to DefaultPrefetch.
	Prefetch int
	// ChannelPoolSize is how many channels the publisher keeps open.
	// Defaults to DefaultChannelPoolSize.
	ChannelPoolSize int
	// NackDelay is the first pause before a nacked message is requeued,
	// so that a failing message does not loop hot. The pause is NackDelay
	// plus the time the subscription has been nacking since its last ack,
	// up to MaxNackDelay: it doubles for a message nacked on every
	// delivery, while messages nacked together each wait NackDelay.
	// Defaults to DefaultNackDelay.
	NackDelay time.Duration
	// MaxNackDelay caps NackDelay's growth. Defaults to
	// DefaultMaxNackDelay.
	MaxNackDelay time.Duration
	// ConnectInterval is the first pause between attempts to connect when
	// the broker is down at start or the connection was lost; it doubles
	// up to MaxConnectInterval. Defaults to DefaultConnectInterval.
	ConnectInterval time.Duration
	// MaxConnectInterval caps ConnectInterval's growth. Defaults to
	// DefaultMaxConnectInterval.
	MaxConnectInterval time.Duration
	// QueueType is the type of every consumer queue: QueueClassic or
	// QueueQuorum, declared durable with x-queue-type quorum and
	// x-delivery-limit DeliveryLimit. A queue's type cannot change:
	// RabbitMQ refuses to declare an existing queue with other arguments
	// (docs/transports.md says how to move a consumer to a queue of the
	// other type). Defaults to QueueClassic.
	QueueType string
	// DeliveryLimit is the x-delivery-limit of quorum queues: RabbitMQ
	// drops a message returned to the queue more often (RabbitMQ 4 sets
	// 20 when the queue does not say). Keep it above every consumer's
	// max_deliveries, so that the framework dead-letters first. Defaults
	// to DefaultDeliveryLimit.
	DeliveryLimit int
	// QueueArguments are further arguments of every consumer queue, e.g.
	// {"x-max-length": 100000}. RabbitMQ refuses to redeclare an existing
	// queue with other arguments. Defaults to none.
	QueueArguments amqp091.Table
	// Heartbeat is the AMQP heartbeat the connection proposes to the
	// broker, in whole seconds: when neither side sent anything for
	// about two heartbeats, the broker closes the connection, and with
	// it the process's consumers, handing their unacknowledged messages
	// and a queue's single active consumer to others. A shorter one
	// hands over sooner from a process that froze (a stopped VM, a long
	// pause); a broker that asks for a shorter one, or a heartbeat in
	// the URL, wins. The app sets a third of partition_lease. At least a
	// second. Defaults to DefaultHeartbeat.
	Heartbeat time.Duration
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
	c.QueueType = cmp.Or(c.QueueType, QueueClassic)
	c.DeliveryLimit = cmp.Or(c.DeliveryLimit, DefaultDeliveryLimit)
	c.Heartbeat = cmp.Or(c.Heartbeat, DefaultHeartbeat)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ErrMissingURL is returned for a Config without a URL.
var ErrMissingURL = errors.New("amqp: missing URL (e.g. amqp://guest:guest@127.0.0.1:5672/)")

// Validate reports the first invalid field of c.
func (c TransportConfig) Validate() error {
	if _, err := ParseURLs(c.URL); err != nil {
		return err
	}
	switch {
	case c.QueueType != QueueClassic && c.QueueType != QueueQuorum:
		return fmt.Errorf("amqp: QueueType must be %s or %s, got %q", QueueClassic, QueueQuorum, c.QueueType)
	case c.DeliveryLimit < 1 || c.DeliveryLimit > math.MaxInt32:
		return fmt.Errorf("amqp: DeliveryLimit must be between 1 and %d, got %d", math.MaxInt32, c.DeliveryLimit)
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return fmt.Errorf("amqp: Prefetch must be between 1 and 65535, got %d", c.Prefetch)
	case c.ChannelPoolSize < 1:
		return fmt.Errorf("amqp: ChannelPoolSize must be at least 1, got %d", c.ChannelPoolSize)
	case c.NackDelay < 0 || c.MaxNackDelay < c.NackDelay:
		return fmt.Errorf("amqp: want 0 <= NackDelay (%s) <= MaxNackDelay (%s)", c.NackDelay, c.MaxNackDelay)
	case c.ConnectInterval <= 0 || c.MaxConnectInterval < c.ConnectInterval:
		return fmt.Errorf("amqp: want 0 < ConnectInterval (%s) <= MaxConnectInterval (%s)", c.ConnectInterval, c.MaxConnectInterval)
	case c.Heartbeat < time.Second || c.Heartbeat > math.MaxUint16*time.Second:
		return fmt.Errorf("amqp: Heartbeat must be between 1s and %s, got %s", math.MaxUint16*time.Second, c.Heartbeat)
	}
	return nil
}

// queueArguments returns the arguments of every consumer queue of c: its
// QueueArguments, and for a quorum queue its type and delivery limit.
func (c TransportConfig) queueArguments() amqp091.Table {
	if c.QueueType != QueueQuorum {
		return c.QueueArguments
	}
	args := make(amqp091.Table, len(c.QueueArguments)+2)
	maps.Copy(args, c.QueueArguments)
	args["x-queue-type"] = QueueQuorum
	args["x-delivery-limit"] = int32(c.DeliveryLimit)
	return args
}

// redactURLs hides the password of each of a comma-separated list of AMQP
// URLs.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		parts[i] = redact(strings.TrimSpace(u))
	}
	return strings.Join(parts, ",")
}

// redact hides the password of an AMQP URL.
func redact(u string) string {
	uri, err := amqp091.ParseURI(u)
	if err != nil || uri.Password == "" {
		return u
	}
	return strings.Replace(u, ":"+uri.Password+"@", ":xxxxx@", 1)
}
