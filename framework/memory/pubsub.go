package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/nackdelay"
)

const (
	// DefaultNackDelay is the first pause before a nacked message is sent
	// again.
	DefaultNackDelay = 100 * time.Millisecond
	// DefaultMaxNackDelay caps the pause, which grows while a
	// subscription nacks without an ack.
	DefaultMaxNackDelay = 5 * time.Second
)

// ErrPubSubClosed is returned by a pubSub's methods after Close.
var ErrPubSubClosed = errors.New("memory: pubsub closed")

// TransportConfig configures a pubSub.
type TransportConfig struct {
	// NackDelay is the first pause before a nacked message is sent again.
	// The pause is NackDelay plus the time the subscription has been
	// nacking since its last ack, up to MaxNackDelay: it doubles for a
	// message nacked on every delivery. Defaults to DefaultNackDelay.
	NackDelay time.Duration
	// MaxNackDelay caps NackDelay's growth. Defaults to
	// DefaultMaxNackDelay.
	MaxNackDelay time.Duration
	// Logger receives GoChannel's logs. Defaults to none.
	Logger watermill.LoggerAdapter
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c TransportConfig) WithDefaults() TransportConfig {
	c.NackDelay = cmp.Or(c.NackDelay, DefaultNackDelay)
	c.MaxNackDelay = cmp.Or(c.MaxNackDelay, max(DefaultMaxNackDelay, c.NackDelay))
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

// Validate reports the first invalid field of c.
func (c TransportConfig) Validate() error {
	if c.NackDelay < 0 {
		return fmt.Errorf("memory: NackDelay %s is negative", c.NackDelay)
	}
	if c.MaxNackDelay < c.NackDelay {
		return fmt.Errorf("memory: MaxNackDelay %s is below NackDelay %s", c.MaxNackDelay, c.NackDelay)
	}
	return nil
}

// pubSub is the memory transport: watermill's GoChannel, persistent (a
// subscription receives what was published before it, kept in memory
// until the process ends), with a pause before a nacked message is sent
// again. GoChannel alone sends it again at once, so a message that keeps
// being nacked (an event waiting for an earlier one under strict order, a
// database that is down) would loop hot.
//
// Every subscription of a topic receives every message: there are no
// consumer groups. Nothing survives the process. For tests only.
type pubSub struct {
	ch  *gochannel.GoChannel
	fwd *nackdelay.Forwarder
}

var (
	_ message.Publisher  = (*pubSub)(nil)
	_ message.Subscriber = (*pubSub)(nil)
)

// newPubSub returns a pubSub configured by cfg.
func newPubSub(cfg TransportConfig) (*pubSub, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &pubSub{
		ch:  gochannel.NewGoChannel(gochannel.Config{Persistent: true}, cfg.Logger),
		fwd: nackdelay.NewForwarder(nackdelay.Backoff{First: cfg.NackDelay, Max: cfg.MaxNackDelay}),
	}, nil
}

// Publish publishes copies of msgs to topic, stamped with the time
// (framework.MetadataPublishedAt, replacing a producer's). It returns
// once every subscription of topic has received them.
func (p *pubSub) Publish(topic string, msgs ...*message.Message) error {
	at := time.Now().UTC().Format(time.RFC3339Nano)
	stamped := make([]*message.Message, len(msgs))
	for i, msg := range msgs {
		stamped[i] = msg.Copy()
		stamped[i].Metadata.Set(framework.MetadataPublishedAt, at)
	}
	if err := p.ch.Publish(topic, stamped...); err != nil {
		return fmt.Errorf("memory: publish to %s: %w", topic, err)
	}
	return nil
}

// Subscribe returns the messages of topic, until ctx ends or the pubSub
// closes. A message nacked is sent again after the pause.
func (p *pubSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if p.fwd.Closed() {
		return nil, ErrPubSubClosed
	}
	in, err := p.ch.Subscribe(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("memory: subscribe to %s: %w", topic, err)
	}
	out, err := p.fwd.Forward(ctx, in)
	if err != nil {
		return nil, ErrPubSubClosed // in closes with the GoChannel
	}
	return out, nil
}

// Close stops every subscription and forgets every message. It waits for
// the subscriptions' goroutines.
func (p *pubSub) Close() error {
	if !p.fwd.Close() {
		return nil
	}
	err := p.ch.Close()
	p.fwd.Wait()
	if err != nil {
		return fmt.Errorf("memory: close: %w", err)
	}
	return nil
}
