package amqp

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestSubscriptionEndHandsOutPrefetch: when the subscription of a reader
// that settles its messages itself ends, the deliveries that the broker
// sent ahead (the prefetch) are handed out before its channel closes, as
// first deliveries, for the reader to hand back itself: closing the
// channel would requeue them flagged redelivered, though nothing handled
// them. The channel of messages closes once each was settled.
func TestSubscriptionEndHandsOutPrefetch(t *testing.T) {
	t.Parallel()
	const concurrency = 2
	const n = concurrency + DefaultPrefetch
	url := testenv.Require(t, testenv.AMQPURLVar)
	tr := newTransport(t, TransportConfig{URL: url, NackDelay: 20 * time.Millisecond})
	topic, consumer := "subs.end"+randomSuffix(), "subs-end"+randomSuffix()
	sc := driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: concurrency, Settles: true}
	sub, err := tr.Subscribe(sc)
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	for i := range n {
		require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage("m-"+strconv.Itoa(i), []byte(`{}`))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)
	settler, ok := sub.Subscriber.(driver.Settler)
	require.True(t, ok)

	got := map[string]string{}
	var held []*message.Message
	for range concurrency {
		m := receive(t, ch)
		held = append(held, m)
		got[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
	}
	time.Sleep(300 * time.Millisecond) // the broker sends the prefetch
	cancel()                           // the subscription ends
	// Settled once the consumer was cancelled: a nack before would have
	// the broker deliver the message again, to this consumer.
	time.Sleep(300 * time.Millisecond)
	for _, m := range held {
		m.Nack()
		settler.Settle(m, false)
	}
	deadline := time.After(2 * handBackTime)
	for open := true; open; {
		select {
		case m, more := <-ch:
			if !more {
				open = false
				break
			}
			if _, seen := got[m.UUID]; !seen {
				got[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
			}
			m.Nack()
			settler.Settle(m, false)
		case <-deadline:
			t.Fatalf("the channel did not close; got %v", got)
		}
	}
	want := map[string]string{}
	for i := range n {
		want["m-"+strconv.Itoa(i)] = "false"
	}
	require.Equal(t, want, got, "every message the broker sent is handed out, as a first delivery")
}
