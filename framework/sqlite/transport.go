package sqlite

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/replay"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// TransportConfig configures a Transport.
type TransportConfig struct {
	// TablePrefix is put before the name of every table of the Pub/Sub. It
	// must match ^[a-z_][a-z0-9_]*$. Defaults to empty.
	TablePrefix string
	// Subscriber is the template of each consumer's Subscriber: Subscribe
	// sets its ConsumerGroup, TablePrefix, Notifier and Logger, its
	// MaxInFlight to the consumer's concurrency (and so, unless set here,
	// its ClaimBatchSize) and, when the consumer gives an attempt timeout,
	// its LeaseDuration (twice the attempt timeout, at least a second).
	// Defaults to SubscriberConfig's defaults.
	Subscriber SubscriberConfig
	// Logger receives the transport's logs. Defaults to nil: quiet.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c TransportConfig) WithDefaults() TransportConfig {
	c.Logger = pubsubLogger(c.Logger)
	c.Subscriber.TablePrefix = c.TablePrefix
	c.Subscriber.Logger = c.Logger
	c.Subscriber = c.Subscriber.WithDefaults()
	return c
}

// Validate reports the first invalid field of c.
func (c TransportConfig) Validate() error {
	if err := validatePubSubPrefix("TransportConfig", c.TablePrefix); err != nil {
		return err
	}
	if err := c.Subscriber.Validate(); err != nil {
		return fmt.Errorf("sqlite: TransportConfig.Subscriber: %w", err)
	}
	return nil
}

// Transport is the SQLite transport (driver.Transport): a Publisher
// and a Subscriber per consumer on one file, sharing a Notifier so that a
// publish wakes the subscriptions of this process at once.
//
// A consumer has one subscription per event type and one for each of its
// replay topics (driver.SubscribeConfig.ReplayTopics: its own, and its
// former names'), each holding up to the consumer's concurrency of
// leases in flight.
type Transport struct {
	db  *sqlx.DB
	cfg TransportConfig
	// template is cfg.Subscriber as given, its zero fields left for each
	// Subscriber to default from its own MaxInFlight (ClaimBatchSize).
	template SubscriberConfig
	notifier *Notifier
	pub      *Publisher

	subs subscribers.Set
	// watchCounted is set once a Subscription counted the notifier's
	// watch in its SubscriberConns.
	watchCounted atomic.Bool
}

var _ driver.Transport = (*Transport)(nil)

// New returns the transport on db, which should come from Open (WAL,
// busy timeout, BEGIN IMMEDIATE). Close leaves db open.
func New(db *sqlx.DB, cfg TransportConfig) (*Transport, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	template := cfg.Subscriber
	cfg = cfg.WithDefaults()
	template.TablePrefix, template.Logger = cfg.Subscriber.TablePrefix, cfg.Subscriber.Logger
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	notifier := NewNotifier()
	pub, err := NewPublisher(db, PublisherConfig{TablePrefix: cfg.TablePrefix, Notifier: notifier, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("sqlite: transport: %w", err)
	}
	return &Transport{db: db, cfg: cfg, template: template, notifier: notifier, pub: pub}, nil
}

// Publisher returns the transport's publisher.
func (t *Transport) Publisher() message.Publisher { return t.pub }

// Subscribe returns a new Subscriber of sc.Consumer's group, holding up
// to sc.Concurrency messages in flight per subscription, with the lease
// leaseFor(sc.AttemptTimeout) when that is set.
func (t *Transport) Subscribe(sc driver.SubscribeConfig) (driver.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return driver.Subscription{}, fmt.Errorf("sqlite: %w", err)
	}
	if sc.Partitions > 1 {
		return driver.Subscription{}, fmt.Errorf("sqlite: consumer %s: partitions: %d: the sqlite transport does not partition: the file has one writer and one machine: run the consumer in one process (docs/scaling.md)", sc.Consumer, sc.Partitions)
	}
	cfg := t.template
	cfg.ConsumerGroup = sc.Consumer
	cfg.Notifier = t.notifier
	cfg.MaxInFlight = sc.Concurrency
	if sc.AttemptTimeout > 0 {
		cfg.LeaseDuration = leaseFor(sc.AttemptTimeout)
	}
	sub, err := NewSubscriber(t.db, cfg)
	if err != nil {
		return driver.Subscription{}, fmt.Errorf("sqlite: consumer %s: %w", sc.Consumer, err)
	}
	sub.settles = sc.Settles
	sub.hold = sc.Hold
	t.subs.Add(sub)
	topics := append(append([]string(nil), sc.Types...), sc.ReplayTopics()...)
	// Each topic's subscription hands out up to MaxInFlight messages, each
	// holding its attempt's connection, and takes one connection at a time for
	// its claims and acks; the subscriber one for its cleanup; the
	// notifier's watch of new messages, shared by every subscriber, is
	// counted with the first.
	own := len(topics) + 1
	if t.watchCounted.CompareAndSwap(false, true) {
		own++
	}
	return driver.Subscription{
		Subscriber:      sub,
		Topics:          topics,
		Bind:            sc.Types,
		Conns:           len(topics) * sc.Concurrency,
		SubscriberConns: own,
	}, nil
}

// Replay publishes msgs to the replay topic of consumer (see
// pipeline.ReplayTopic), to which only consumer subscribes.
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	topic := pipeline.ReplayTopic(consumer)
	if err := replay.Publish(ctx, func(m *message.Message) error { return t.pub.Publish(topic, m) }, msgs...); err != nil {
		return fmt.Errorf("sqlite: replay to %s: %w", consumer, err)
	}
	return nil
}

// Ready reports true: the file is always there.
func (t *Transport) Ready() bool { return true }

// Close closes the subscribers and the publisher; db stays open.
func (t *Transport) Close() error { return t.subs.Close(t.pub) }

// leaseFor returns the lease of a consumer's messages whose attempts time
// out after attemptTimeout. The subscriber renews it every third of its
// length while a message is held, so it need not outlast the handling,
// only a renewal period plus a renewal's wait for the file's write lock,
// which an attempt holds at most its timeout: twice the attempt timeout,
// at least a second, at most the longest duration (twice a timeout of
// centuries overflowed to a lease of a second, under which the messages
// of a long attempt went out again every second). It bounds how long the
// messages of a process that died wait, whatever the concurrency.
func leaseFor(attemptTimeout time.Duration) time.Duration {
	if attemptTimeout > math.MaxInt64/2 {
		return math.MaxInt64
	}
	return max(time.Second, 2*attemptTimeout)
}
