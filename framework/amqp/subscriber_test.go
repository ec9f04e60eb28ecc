package amqp

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestSubscriptionHandsOutConcurrencyAtOnce: the one subscription of a
// consumer hands out up to its concurrency of messages without waiting
// for their acks (watermill-amqp's subscriber hands out one), no more,
// and acks each by itself: acking the last one handed out leaves the
// earlier ones, which go back to the queue when the subscriber closes.
func TestSubscriptionHandsOutConcurrencyAtOnce(t *testing.T) {
	t.Parallel()
	const concurrency = 4
	url := testenv.Require(t, testenv.AMQPURLVar)
	tr := newTransport(t, TransportConfig{URL: url, NackDelay: 20 * time.Millisecond})
	topic, consumer := "subs.many"+randomSuffix(), "subs-many"+randomSuffix()
	sc := driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: concurrency}
	sub, err := tr.Subscribe(sc)
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	for i := range concurrency + 1 {
		require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage("m-"+string(rune('a'+i)), []byte(`{}`))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)

	held := make([]*message.Message, concurrency)
	for i := range held {
		held[i] = receive(t, ch) // none acked yet
	}
	select {
	case m := <-ch:
		t.Fatalf("%s handed out beyond the concurrency", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
	held[concurrency-1].Ack()
	last := receive(t, ch) // its place is free
	last.Ack()
	require.NoError(t, sub.Subscriber.Close()) // the others go back

	again, err := tr.Subscribe(sc)
	require.NoError(t, err)
	ch, err = again.Subscriber.Subscribe(ctx, again.Topics[0])
	require.NoError(t, err)
	var want, got []string
	for _, m := range held[:concurrency-1] {
		want = append(want, m.UUID)
		m := receive(t, ch)
		require.Equal(t, "true", m.Metadata.Get(framework.MetadataRedelivered), m.UUID)
		got = append(got, m.UUID)
		m.Ack()
	}
	require.ElementsMatch(t, want, got, "the unacked ones, and only them, come back")
	select {
	case m := <-ch:
		t.Fatalf("%s came back though acked", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}

	require.Equal(t, []string{topic}, sub.Topics, "one router handler")
	require.Equal(t, concurrency, sub.Conns)
}
