package runner

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
)

// blockedSubscriber's Subscribe waits until release closes or its context
// ends, like a subscription waiting for a connection.
type blockedSubscriber struct {
	message.Subscriber
	release chan struct{}
}

func (s blockedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.release:
		return s.Subscriber.Subscribe(ctx, topic)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestUntilRunning: a handler whose subscription is ready does not handle
// its messages while another handler still subscribes; if the router never
// runs, the message is nacked unhandled.
func TestUntilRunning(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*message.Router, *gochannel.GoChannel, chan struct{}, *atomic.Int32) {
		t.Helper()
		ch := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
		t.Cleanup(func() { _ = ch.Close() })
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(untilRunning(router))
		var handled atomic.Int32
		router.AddConsumerHandler("first", "first", ch, func(*message.Message) error {
			handled.Add(1)
			return nil
		})
		release := make(chan struct{})
		router.AddConsumerHandler("second", "second", blockedSubscriber{Subscriber: ch, release: release}, func(*message.Message) error { return nil })
		// The message is there before the router runs; the handlers are
		// started in map order, so "first" may subscribe before or after
		// "second" blocks.
		require.NoError(t, ch.Publish("first", message.NewMessage("m", nil)))
		return router, ch, release, &handled
	}

	t.Run("HeldUntilRunning", func(t *testing.T) {
		t.Parallel()
		router, _, release, handled := setup(t)
		done := make(chan error, 1)
		go func() { done <- router.Run(context.Background()) }()
		time.Sleep(200 * time.Millisecond) // "first" may have received the message
		require.Zero(t, handled.Load(), "handled before every handler subscribed")
		close(release)
		<-router.Running()
		require.Eventually(t, func() bool { return handled.Load() == 1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})

	t.Run("NackedWhenNeverRunning", func(t *testing.T) {
		t.Parallel()
		router, _, _, handled := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- router.Run(ctx) }()
		time.Sleep(200 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.Error(t, err, "the second subscription failed")
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return when its context ended")
		}
		require.Zero(t, handled.Load())
	})
}
