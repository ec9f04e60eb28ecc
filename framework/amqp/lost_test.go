package amqp

import (
	"context"
	neturl "net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestLostDeliveryIsNotCharged: the messages in flight when the
// connection is lost (a network outage: the test cuts it) come again on
// the next connection as the same deliveries resumed, not flagged
// redelivered, so that the delivery guard does not charge the outage to
// them; a message nacked and delivered again is flagged, and so is a
// lost one's second redelivery.
func TestLostDeliveryIsNotCharged(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled { // watermill-amqp races on a reconnection
		testserver.RerunWithoutRace(t, "TestLostDeliveryIsNotCharged")
		return
	}
	u, err := neturl.Parse(testenv.Require(t, testenv.AMQPURLVar))
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	tr := newTransport(t, TransportConfig{URL: u.String(), NackDelay: 20 * time.Millisecond})
	topic, consumer := "lost.deliveries"+randomSuffix(), "lost-deliveries"+randomSuffix()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	for _, id := range []string{"a", "b"} {
		require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(id, []byte(`{}`))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)
	byID := func(n int) map[string]string {
		t.Helper()
		got := map[string]string{}
		for range n {
			m := receive(t, ch)
			got[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
		}
		return got
	}

	first := byID(2) // held, neither acked nor nacked
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, first)
	proxy.Cut()
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, byID(2),
		"the lost deliveries resumed, not charged")
	proxy.Cut()
	again := map[string]string{}
	for range 2 {
		m := receive(t, ch)
		again[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
		if m.UUID == "b" {
			m.Nack()
		} else {
			m.Ack()
		}
	}
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, again, "lost again, resumed again")
	m := receive(t, ch)
	require.Equal(t, "b", m.UUID)
	require.Equal(t, "true", m.Metadata.Get(framework.MetadataRedelivered), "nacked: a redelivery")
	m.Ack()
}
