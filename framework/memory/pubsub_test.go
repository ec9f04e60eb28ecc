package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
)

// pubSub is a memory Transport's publisher with a subscriber of its own;
// Close closes the transport.
type pubSub struct {
	tr *memory.Transport
	message.Subscriber
}

func (p pubSub) Publish(topic string, msgs ...*message.Message) error {
	return p.tr.Publisher().Publish(topic, msgs...)
}

func (p pubSub) Close() error { return p.tr.Close() }

func openPubSub(cfg memory.TransportConfig) (pubSub, error) {
	tr, err := memory.New(cfg)
	if err != nil {
		return pubSub{}, err
	}
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "test", Types: []string{"test"}})
	if err != nil {
		return pubSub{}, err
	}
	return pubSub{tr: tr, Subscriber: sub.Subscriber}, nil
}

func newPubSub(t *testing.T, cfg memory.TransportConfig) pubSub {
	t.Helper()
	ps, err := openPubSub(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

// TestPubSubUniversal runs watermill's universal suite on the pubSub, with
// the features watermill declares for a persistent GoChannel.
func TestPubSubUniversal(t *testing.T) {
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:        false,
		ExactlyOnceDelivery:   true,
		GuaranteedOrder:       false,
		Persistent:            false,
		RequireSingleInstance: true,
		ForceShort:            true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		ps, err := openPubSub(memory.TransportConfig{NackDelay: time.Millisecond, MaxNackDelay: 5 * time.Millisecond})
		require.NoError(t, err)
		return ps, ps
	}, nil)
}

// TestPubSubNackBacksOff: GoChannel alone sends a nacked message again at
// once, thousands of times a second; the pubSub pauses 50, 100, 200, 400
// ms between deliveries, so a second and a half holds about five.
func TestPubSubNackBacksOff(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t, memory.TransportConfig{NackDelay: 50 * time.Millisecond, MaxNackDelay: 400 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := ps.Subscribe(ctx, "nacked")
	require.NoError(t, err)
	require.NoError(t, ps.Publish("nacked", message.NewMessage("n-1", []byte(`{}`))))

	deliveries := 0
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		select {
		case msg := <-ch:
			require.Equal(t, "n-1", msg.UUID)
			deliveries++
			msg.Nack()
		case <-time.After(10 * time.Second):
			t.Fatal("the nacked message was not sent again")
		}
	}
	require.GreaterOrEqual(t, deliveries, 3)
	require.LessOrEqual(t, deliveries, 8, "deliveries in 1.5s")
	msg := <-ch
	msg.Ack()
}

// TestPubSubCloseWhilePausing: a message nacked and waiting for its pause
// does not hold up Close.
func TestPubSubCloseWhilePausing(t *testing.T) {
	t.Parallel()
	ps, err := openPubSub(memory.TransportConfig{NackDelay: time.Hour})
	require.NoError(t, err)
	ch, err := ps.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	require.NoError(t, ps.Publish("t", message.NewMessage("m", nil)))
	(<-ch).Nack()
	done := make(chan error, 1)
	go func() { done <- ps.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the pause")
	}
	_, ok := <-ch
	require.False(t, ok, "the subscription's channel is closed")
	_, err = ps.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, memory.ErrPubSubClosed)
}

func TestTransportConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := openPubSub(memory.TransportConfig{NackDelay: -time.Second})
	require.ErrorContains(t, err, "NackDelay")
	_, err = openPubSub(memory.TransportConfig{NackDelay: time.Second, MaxNackDelay: time.Millisecond})
	require.ErrorContains(t, err, "MaxNackDelay")
}
