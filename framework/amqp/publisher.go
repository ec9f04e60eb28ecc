package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/replay"
)

// watermillConfig is the watermill-amqp configuration of the framework's
// topology: each topic (event type) is a durable fanout exchange of that
// name, each queue is durable, of cfg's type, and named by queueName,
// messages are
// persistent and confirmed by the broker.
func watermillConfig(cfg TransportConfig, queueName wamqp.QueueNameGenerator) wamqp.Config {
	c := wamqp.NewDurablePubSubConfig(cfg.URL, queueName)
	c.Marshaler = Marshaler{}
	c.Queue.Arguments = cfg.queueArguments()
	c.Publish.ConfirmDelivery = true
	c.Publish.ChannelPoolSize = cfg.ChannelPoolSize
	c.Consume.Qos.PrefetchCount = cfg.Prefetch
	return c
}

// publisher publishes each message to the fanout exchange named by its
// topic, declaring the exchange on first use, and waits for the broker's
// confirm. Replay publishes to one consumer's queue instead.
// PublishDeferred publishes the same messages without waiting for each
// confirm (see confirm.go).
type publisher struct {
	conn *connection

	mu       sync.Mutex
	events   *wamqp.Publisher // exchange per topic
	direct   *wamqp.Publisher // default exchange, routing key = queue
	confirms *confirmChannel  // exchange per topic, confirms deferred
	closed   bool
}

var _ message.Publisher = (*publisher)(nil)

// newPublisher returns a publisher on conn. It may be built before
// conn.Connect; Publish returns ErrNotConnected until then.
func newPublisher(conn *connection) (*publisher, error) {
	if conn == nil {
		return nil, fmt.Errorf("amqp: publisher: missing connection")
	}
	return &publisher{conn: conn, confirms: newConfirmChannel(conn)}, nil
}

func (p *publisher) publishers() (events, direct *wamqp.Publisher, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, ErrClosed
	}
	if p.events != nil {
		return p.events, p.direct, nil
	}
	w, err := p.conn.wrapper()
	if err != nil {
		return nil, nil, err
	}
	events, err = wamqp.NewPublisherWithConnection(p.conn.publisherConfig(), p.conn.logger, w)
	if err != nil {
		return nil, nil, fmt.Errorf("amqp: publisher: %w", err)
	}
	dc := p.conn.publisherConfig()
	dc.Exchange.GenerateName = func(string) string { return "" } // the default exchange
	dc.Publish.GenerateRoutingKey = func(queue string) string { return queue }
	dc.Publish.ChannelPoolSize = 1
	direct, err = wamqp.NewPublisherWithConnection(dc, p.conn.logger, w)
	if err != nil {
		_ = events.Close()
		return nil, nil, fmt.Errorf("amqp: replay publisher: %w", err)
	}
	p.events, p.direct = events, direct
	return events, direct, nil
}

// Publish publishes msgs to the exchange topic, one after the other, and
// returns once the broker confirmed each of them. A message that does not
// fit in a frame of the connection is refused before it is sent, with
// ErrHeadersTooLarge, and the rest with it. Messages published before any
// consumer queue is bound to the exchange are dropped by RabbitMQ:
// subscribers bind their queues at start (subscriber.SubscribeInitialize).
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	events, _, err := p.publishers()
	if err != nil {
		return err
	}
	if err := events.Publish(topic, msgs...); err != nil {
		return fmt.Errorf("amqp: publish to %s: %w", topic, err)
	}
	return nil
}

// Replay publishes msgs through the default exchange straight to the queue
// of consumer, so that no other consumer of their type sees them again. It
// fails when the queue does not exist, and with ErrHeadersTooLarge, before
// it is sent, for a message that does not fit in a frame (see Publish): a
// permanent error of code framework.CodeTooLarge, since it never will.
func (p *publisher) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	_, direct, err := p.publishers()
	if err != nil {
		return err
	}
	ch, err := p.conn.channel()
	if err != nil {
		return fmt.Errorf("amqp: replay to %s: %w", consumer, err)
	}
	// A publish to a missing queue would vanish silently.
	if _, err := ch.QueueDeclarePassive(consumer, true, false, false, false, nil); err != nil {
		return fmt.Errorf("amqp: replay to %s: no such queue: %w", consumer, err)
	}
	_ = ch.Close()
	publish := func(m *message.Message) error { return direct.Publish(consumer, m) }
	if err := replay.Publish(ctx, publish, msgs...); err != nil {
		err = fmt.Errorf("amqp: replay to %s: %w", consumer, err)
		if errors.Is(err, ErrHeadersTooLarge) {
			return framework.Permanent(framework.CodeTooLarge, err)
		}
		return err
	}
	return nil
}

// Close closes the publisher; the connection stays open.
func (p *publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	errs := []error{p.confirms.Close()}
	if p.events != nil {
		errs = append(errs, p.events.Close(), p.direct.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("amqp: close publisher: %w", err)
	}
	return nil
}

// ReplayPartitioned publishes msgs to consumer's consistent-hash exchange
// (see partitions), each with its PartitionHeader, so that each reaches
// the queue of its partition, and its owner, as the events published to
// their types do; no other consumer sees them again. It fails when the
// exchange does not exist, and with a permanent error of code
// framework.CodeTooLarge as Replay does.
func (p *publisher) ReplayPartitioned(ctx context.Context, consumer string, msgs ...*message.Message) error {
	if _, _, err := p.publishers(); err != nil {
		return err
	}
	ch, err := p.conn.channel()
	if err != nil {
		return fmt.Errorf("amqp: replay to %s: %w", consumer, err)
	}
	defer func() { _ = ch.Close() }()
	exchange := consumer + exchangeSuffix
	// A publish to a missing exchange would close the channel.
	if err := ch.ExchangeDeclarePassive(exchange, kindConsistentHash, true, false, false, false, nil); err != nil {
		return fmt.Errorf("amqp: replay to %s: no exchange %s: %w", consumer, exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("amqp: replay to %s: put channel in confirm mode: %w", consumer, err)
	}
	marshal := framedMarshaler{conn: p.conn}
	publish := func(m *message.Message) error {
		pub, err := marshal.Marshal(m)
		if err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(m.Context(), exchange, "", false, false, pub)
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.UUID, err)
		}
		switch acked, err := dc.WaitContext(m.Context()); {
		case err != nil:
			return fmt.Errorf("wait for the confirm of %s: %w", m.UUID, err)
		case !acked:
			return fmt.Errorf("%w: %s", ErrNotConfirmed, m.UUID)
		}
		return nil
	}
	if err := replay.Publish(ctx, publish, msgs...); err != nil {
		err = fmt.Errorf("amqp: replay to %s: %w", consumer, err)
		if errors.Is(err, ErrHeadersTooLarge) {
			return framework.Permanent(framework.CodeTooLarge, err)
		}
		return err
	}
	return nil
}

// partitioned reports whether consumer's consistent-hash exchange exists:
// whether it is partitioned, for a Replay to a consumer that this process
// did not subscribe.
func (p *publisher) partitioned(consumer string) (bool, error) {
	ch, err := p.conn.channel()
	if err != nil {
		return false, fmt.Errorf("amqp: %w", err)
	}
	err = ch.ExchangeDeclarePassive(consumer+exchangeSuffix, kindConsistentHash, true, false, false, false, nil)
	if isCode(err, amqp091.NotFound) {
		return false, nil // the broker closed the channel
	}
	_ = ch.Close()
	if err != nil {
		return false, fmt.Errorf("amqp: check exchange %s: %w", consumer+exchangeSuffix, err)
	}
	return true, nil
}
