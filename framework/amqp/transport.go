package amqp

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// Transport is the AMQP transport (framework.Transport): one connection
// shared by a publisher and a subscriber per consumer.
//
// Each consumer has one durable queue named after it, bound to the
// exchange of each of its types (Subscription.Initialize binds them). Its
// concurrency is that many subscriptions of the queue, each handling one
// message at a time (competing consumers; the prefetch only buffers).
//
// New does not dial: call Connect before the subscriptions are
// initialized; until then Publish and Replay return ErrNotConnected.
type Transport struct {
	conn *connection
	pub  *publisher

	subs subscribers.Set
}

var _ framework.Transport = (*Transport)(nil)

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

// Connect dials the broker: it retries with
// backoff until ctx ends, and not at all when the broker refuses the
// credentials (ErrAccessRefused).
func (t *Transport) Connect(ctx context.Context) error { return t.conn.Connect(ctx) }

// Publisher returns the transport's publisher.
func (t *Transport) Publisher() message.Publisher { return t.pub }

// Subscribe returns a new subscriber of sc.Consumer's queue with
// sc.Concurrency router handlers, all reading the queue, bound to each of
// sc.Types when the Subscription is initialized.
func (t *Transport) Subscribe(sc framework.SubscribeConfig) (framework.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return framework.Subscription{}, fmt.Errorf("amqp: %w", err)
	}
	sub, err := subscriberOf(t.conn, sc.Consumer)
	if err != nil {
		return framework.Subscription{}, fmt.Errorf("amqp: consumer %s: %w", sc.Consumer, err)
	}
	t.subs.Add(sub)
	// Subscribing to any of the types reads the one queue.
	topics := make([]string, sc.Concurrency)
	for i := range topics {
		topics[i] = sc.Types[0]
	}
	// Each router handler takes one message at a time: sc.Concurrency in
	// flight (the prefetch only buffers).
	return framework.Subscription{Subscriber: sub, Topics: topics, Bind: sc.Types, Conns: len(topics)}, nil
}

// Replay publishes msgs straight to consumer's queue, through the default
// exchange.
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	return t.pub.Replay(ctx, consumer, msgs...)
}

// Ready reports whether the connection is up: false before Connect and
// while watermill-amqp reconnects.
func (t *Transport) Ready() bool { return t.conn.Connected() }

// Close closes the subscribers, the publisher and the connection.
func (t *Transport) Close() error { return t.subs.Close(t.pub, t.conn) }
