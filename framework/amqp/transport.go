package amqp

import (
	"context"
	"fmt"

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
// Config.Prefetch more ahead of them.
//
// New does not dial: call Connect before the subscriptions are
// initialized; until then Publish and Replay return ErrNotConnected.
type Transport struct {
	conn *connection
	pub  *publisher

	subs subscribers.Set
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
	return &Transport{conn: conn, pub: pub}, nil
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
func (t *Transport) Subscribe(sc driver.SubscribeConfig) (driver.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return driver.Subscription{}, fmt.Errorf("amqp: %w", err)
	}
	sub, err := subscriberOf(t.conn, sc.Consumer, sc.Concurrency)
	if err != nil {
		return driver.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
	}
	sub.settles = sc.Settles
	t.subs.Add(sub)
	// Subscribing to any of the types reads the one queue; the router
	// handles each message it hands out in a goroutine of its own.
	return driver.Subscription{Subscriber: sub, Topics: sc.Types[:1], Bind: sc.Types, Conns: sc.Concurrency}, nil
}

// Replay publishes msgs straight to consumer's queue, through the default
// exchange.
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	return t.pub.Replay(ctx, consumer, msgs...)
}

// Ready reports whether the connection is up: false before Connect and
// while watermill-amqp reconnects (to the next node that answers).
func (t *Transport) Ready() bool { return t.conn.Connected() }

// Close closes the subscribers, the publisher and the connection.
func (t *Transport) Close() error { return t.subs.Close(t.pub, t.conn) }
