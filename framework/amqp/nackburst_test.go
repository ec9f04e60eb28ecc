package amqp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// TestNackBurstPausesOnce: messages in flight together and nacked
// together (events waiting for an earlier one under strict order) come
// back after the first pause each, not after a pause that doubles per nack
// of the burst: the sixteenth would wait 2^15 × 20 ms, about 11 minutes,
// holding its slot of the subscription's concurrency.
func TestNackBurstPausesOnce(t *testing.T) {
	t.Parallel()
	const burst = 16
	conn := connect(t, TransportConfig{NackDelay: 20 * time.Millisecond, MaxNackDelay: time.Hour})
	topic, consumer := "traps.b"+randomSuffix(), "traps-b"+randomSuffix()
	sub, err := subscriberOf(conn, consumer, burst)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, sub.SubscribeInitialize(topic))
	pub, err := newPublisher(conn)
	require.NoError(t, err)
	defer pub.Close()
	for i := range burst {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("b-%d", i), []byte(`{}`))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	var first []*message.Message
	for range burst { // all in flight at once: the subscription hands out up to burst
		first = append(first, receive(t, ch))
	}
	for _, msg := range first {
		msg.Nack()
	}
	seen := map[string]bool{}
	for range burst {
		msg := receive(t, ch) // fails after 15s
		require.Equal(t, "true", msg.Metadata.Get(framework.MetadataRedelivered), "%s", msg.UUID)
		seen[msg.UUID] = true
		msg.Ack()
	}
	require.Len(t, seen, burst)
}
