package amqp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestSubscriptionEndIdle: a subscription read by a reader that settles
// its messages, with nothing in flight or sent, ends as soon as its
// consumer's cancel is confirmed, not once handBackTime is over: a
// service's stop does not wait for it.
func TestSubscriptionEndIdle(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	tr := newTransport(t, TransportConfig{URL: url})
	topic, consumer := "subs.idle"+randomSuffix(), "subs-idle"+randomSuffix()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4, Settles: true})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // consuming
	cancel()
	ended := time.Now()
	select {
	case _, more := <-ch:
		require.False(t, more, "a message of an empty queue")
	case <-time.After(2 * handBackTime):
		t.Fatal("the channel did not close")
	}
	require.Less(t, time.Since(ended), handBackTime/2, "the end waited for handBackTime with nothing to hand out")
}
