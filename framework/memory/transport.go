package memory

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/replay"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Transport is the memory transport (driver.Transport) on one pubSub.
// Every subscription gets every message; a consumer has one router
// handler per event type and one for its replay topic, to which it alone
// subscribes. For tests only.
type Transport struct {
	ps *pubSub
}

var _ driver.Transport = (*Transport)(nil)

// New returns a memory transport configured by cfg.
func New(cfg TransportConfig) (*Transport, error) {
	ps, err := newPubSub(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{ps: ps}, nil
}

// Publisher returns the transport's pubSub.
func (t *Transport) Publisher() message.Publisher { return t.ps }

// Subscribe returns a subscriber of the pubSub of its own: closing it
// ends its subscriptions, not the pubSub's.
func (t *Transport) Subscribe(sc driver.SubscribeConfig) (driver.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return driver.Subscription{}, fmt.Errorf("memory: %w", err)
	}
	if sc.Partitions > 1 {
		return driver.Subscription{}, fmt.Errorf("memory: consumer %s: partitions: %d: the memory transport does not partition: the memory transport lives in one process", sc.Consumer, sc.Partitions)
	}
	ctx, cancel := context.WithCancel(context.Background())
	topics := append(append([]string(nil), sc.Types...), pipeline.ReplayTopic(sc.Consumer))
	return driver.Subscription{
		Subscriber: &subscriber{ps: t.ps, ctx: ctx, cancel: cancel},
		Topics:     topics,
		// Each topic's router handler takes one message at a time.
		Conns: len(topics),
	}, nil
}

// Replay publishes msgs to the replay topic of consumer (see
// pipeline.ReplayTopic).
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	topic := pipeline.ReplayTopic(consumer)
	return replay.Publish(ctx, func(m *message.Message) error { return t.ps.Publish(topic, m) }, msgs...)
}

// Ready reports true.
func (t *Transport) Ready() bool { return true }

// Close closes the pubSub, which ends every subscription.
func (t *Transport) Close() error { return t.ps.Close() }

// subscriber is one consumer's view of the pubSub.
type subscriber struct {
	ps     *pubSub
	ctx    context.Context
	cancel context.CancelFunc
}

// Subscribe subscribes to topic until ctx ends or the subscriber closes.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(s.ctx, cancel)
	return s.ps.Subscribe(ctx, topic)
}

// Close ends the subscriber's subscriptions.
func (s *subscriber) Close() error { s.cancel(); return nil }
