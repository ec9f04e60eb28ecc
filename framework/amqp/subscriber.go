package amqp

import (
	"context"
	"fmt"
	"sync"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/internal/nackdelay"
)

// subscriber reads the queue of one consumer. The queue is durable, named
// after the consumer, and bound to the fanout exchange of each topic (event
// type) the consumer handles, one SubscribeInitialize per topic. Every
// Subscribe call, whatever its topic, reads that one queue: open several to
// handle several messages at once (competing consumers; the prefetch alone
// adds no parallelism), and dispatch on the CloudEvent type.
//
// A nacked message goes back to the queue after a pause (Config.NackDelay,
// doubling per consecutive nack of the subscription up to
// Config.MaxNackDelay), never at once: watermill-amqp would requeue it
// immediately and loop hot.
type subscriber struct {
	conn      *connection
	queueName wamqp.QueueNameGenerator

	fwd *nackdelay.Forwarder

	mu  sync.Mutex // guards sub, and its creation against Close
	sub *wamqp.Subscriber
}

var (
	_ message.Subscriber           = (*subscriber)(nil)
	_ message.SubscribeInitializer = (*subscriber)(nil)
)

// subscriberOf returns the subscriber of consumer on conn. It may be
// built before conn.Connect; its methods return ErrNotConnected until
// then.
func subscriberOf(conn *connection, consumer string) (*subscriber, error) {
	if consumer == "" {
		return nil, fmt.Errorf("amqp: subscriber: empty consumer name")
	}
	return newSubscriber(conn, wamqp.GenerateQueueNameConstant(consumer))
}

func newSubscriber(conn *connection, queueName wamqp.QueueNameGenerator) (*subscriber, error) {
	if conn == nil {
		return nil, fmt.Errorf("amqp: subscriber: missing connection")
	}
	return &subscriber{
		conn:      conn,
		queueName: queueName,
		fwd:       nackdelay.NewForwarder(nackdelay.Backoff{First: conn.cfg.NackDelay, Max: conn.cfg.MaxNackDelay}),
	}, nil
}

func (s *subscriber) inner() (*wamqp.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fwd.Closed() {
		return nil, ErrClosed
	}
	if s.sub != nil {
		return s.sub, nil
	}
	w, err := s.conn.wrapper()
	if err != nil {
		return nil, err
	}
	sub, err := wamqp.NewSubscriberWithConnection(watermillConfig(s.conn.cfg, s.queueName), s.conn.logger, w)
	if err != nil {
		return nil, fmt.Errorf("amqp: subscriber: %w", err)
	}
	s.sub = sub
	return sub, nil
}

// SubscribeInitialize declares the exchange of topic and the consumer's
// queue, and binds them, so that nothing published to topic from now on is
// dropped. Call it for every topic of the consumer before anything
// publishes.
func (s *subscriber) SubscribeInitialize(topic string) error {
	sub, err := s.inner()
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(topic); err != nil {
		return fmt.Errorf("amqp: bind %s: %w", topic, err)
	}
	return nil
}

// Subscribe declares and binds like SubscribeInitialize, then consumes the
// consumer's queue until ctx ends or the subscriber closes.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.inner()
	if err != nil {
		return nil, err
	}
	in, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("amqp: subscribe to %s: %w", topic, err)
	}
	out, err := s.fwd.Forward(ctx, in)
	if err != nil {
		return nil, ErrClosed // in closes with the watermill subscriber
	}
	return out, nil
}

// Close stops every subscription: messages in flight go back to the queue.
// The connection stays open.
func (s *subscriber) Close() error {
	s.mu.Lock()
	first := s.fwd.Close()
	sub := s.sub
	s.mu.Unlock()
	if !first {
		return nil
	}
	var err error
	if sub != nil {
		err = sub.Close()
	}
	s.fwd.Wait()
	if err != nil {
		return fmt.Errorf("amqp: close subscriber: %w", err)
	}
	return nil
}
