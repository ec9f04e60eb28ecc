package amqp

import (
	"context"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// connect returns a connected Connection to the test broker, closed when
// the test ends.
func connect(t testing.TB, cfg TransportConfig) *connection {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testenv.Require(t, testenv.AMQPURLVar)
	}
	conn, err := newConnection(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, conn.Connect(ctx))
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestPubSubUniversal runs watermill's universal suite, in short mode, on
// the Publisher, the tolerant Marshaler and the nack-delaying subscriber,
// handing out one message at a time with a prefetch of one. The suite expects a queue per topic and group, so
// it gets one here; the framework's consumer queue is one per consumer,
// exercised by TestTransport.
func TestPubSubUniversal(t *testing.T) {
	conn := connect(t, TransportConfig{NackDelay: 5 * time.Millisecond, MaxNackDelay: 20 * time.Millisecond, Prefetch: 1})
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := newPublisher(conn)
		require.NoError(t, err)
		sub, err := newSubscriber(conn, wamqp.GenerateQueueNameTopicNameWithSuffix("ut-"+group), 1, 1)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = sub.Close()
			_ = pub.Close()
		})
		return pub, sub
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups: true,
		// One Subscribe call handing out one message at a time does so in
		// queue order, and a nacked message goes back to the queue's head.
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		ForceShort:                          true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return withGroup(t, "default")
	}, withGroup)
}
