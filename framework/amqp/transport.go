package amqp

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// Transport is the AMQP transport (driver.Transport): one connection
// shared by a publisher and a subscriber per consumer.
//
// Each consumer has one durable queue named after it, bound to the
// exchange of each of its types (Subscription.Initialize binds them). Its
// one subscription of the queue hands out up to its concurrency of
// messages at once, each acked or nacked by itself, and the broker sends
// Config.Prefetch more ahead of them. A partitioned consumer has a queue
// per partition instead, fed by a consistent-hash exchange of its own
// (see PartitionHeader).
//
// New does not dial: call Connect before the subscriptions are
// initialized; until then Publish and Replay return ErrNotConnected.
type Transport struct {
	conn *connection
	pub  *publisher

	subs subscribers.Set

	mu          sync.Mutex
	partitioned map[string]bool // by consumer, as subscribed here
}

var _ driver.Transport = (*Transport)(nil)

// New returns an unconnected transport configured by cfg.
func New(cfg TransportConfig) (*Transport, error) {
	conn, err := newConnection(cfg)
	if err != nil {
		return nil, err
	}
	pub, err := newPublisher(conn)
	if err != nil {
		return nil, err
	}
	return &Transport{conn: conn, pub: pub, partitioned: map[string]bool{}}, nil
}

// Connect dials the broker, the first of its nodes that answers: it
// retries with backoff until ctx ends, and not at all when the broker
// refuses the credentials (ErrAccessRefused).
func (t *Transport) Connect(ctx context.Context) error { return t.conn.Connect(ctx) }

// Publisher returns the transport's publisher.
func (t *Transport) Publisher() message.Publisher { return t.pub }

// Subscribe returns a new subscriber of sc.Consumer's queue, bound to
// each of sc.Types when the Subscription is initialized, and one router
// handler that reads the queue with up to sc.Concurrency messages in
// flight.
//
// With sc.Partitions above 1 the consumer is partitioned: the subscriber
// is a driver.Assigner of the queues of its partitions, fed by a
// consistent-hash exchange of the consumer's own (see PartitionHeader),
// and its one router handler reads the partitions assigned. Initialize
// fails with ErrNoConsistentHash on a broker without the plugin.
func (t *Transport) Subscribe(sc driver.SubscribeConfig) (driver.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return driver.Subscription{}, fmt.Errorf("amqp: %w", err)
	}
	var sub interface {
		message.Subscriber
		io.Closer
	}
	if sc.Partitions > 1 {
		p, err := partitionedOf(t.conn, sc.Consumer, sc.Concurrency, sc.Partitions)
		if err != nil {
			return driver.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
		}
		p.settles = sc.Settles
		if err := p.allowHold(sc.Hold); err != nil {
			return driver.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
		}
		sub = p
	} else {
		s, err := subscriberOf(t.conn, sc.Consumer, sc.Concurrency)
		if err != nil {
			return driver.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
		}
		s.settles = sc.Settles
		if err := s.allowHold(sc.Hold); err != nil {
			return driver.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
		}
		sub = s
	}
	t.mu.Lock()
	t.partitioned[sc.Consumer] = sc.Partitions > 1
	t.mu.Unlock()
	t.subs.Add(sub)
	// Subscribing to any of the types reads the one queue, or the
	// partitions assigned; the router handles each message it hands out
	// in a goroutine of its own.
	return driver.Subscription{Subscriber: sub, Topics: sc.Types[:1], Bind: sc.Types, Conns: sc.Concurrency}, nil
}

// Replay publishes msgs straight to consumer's queue, through the default
// exchange; to a partitioned consumer, through its consistent-hash
// exchange, so that each reaches its partition's queue.
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	t.mu.Lock()
	partitioned, known := t.partitioned[consumer]
	t.mu.Unlock()
	if !known {
		var err error
		if partitioned, err = t.pub.partitioned(consumer); err != nil {
			return fmt.Errorf("amqp: replay to %s: %w", consumer, err)
		}
	}
	if partitioned {
		return t.pub.ReplayPartitioned(ctx, consumer, msgs...)
	}
	return t.pub.Replay(ctx, consumer, msgs...)
}

// Ready reports whether the connection is up: false before Connect and
// while watermill-amqp reconnects (to the next node that answers).
func (t *Transport) Ready() bool { return t.conn.Connected() }

// Close closes the subscribers, the publisher and the connection.
func (t *Transport) Close() error { return t.subs.Close(t.pub, t.conn) }
