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

// TestNackStreak: the pause after a nack is the first pause plus the time
// since the first nack after the last ack, up to the longest.
func TestNackStreak(t *testing.T) {
	t.Parallel()
	const first, most = 100 * time.Millisecond, 400 * time.Millisecond
	t0 := time.Unix(1000, 0)
	var n nackStreak

	// A message nacked on every delivery, alone: the pauses double.
	at := t0
	for _, want := range []time.Duration{100, 200, 400, 400} {
		pause := n.nacked(at, first, most)
		require.Equal(t, want*time.Millisecond, pause, "nack at %s", at.Sub(t0))
		at = at.Add(pause)
	}

	// An ack ends the streak; messages nacked together then each wait the
	// first pause, however many they are.
	n.acked()
	for i := range 64 {
		require.Equal(t, first, n.nacked(at, first, most), "nack %d of a burst", i+1)
	}
	// Nothing acked since: the next round waits longer.
	require.Equal(t, first+first, n.nacked(at.Add(first), first, most))
}

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
