package amqp

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestPartitionsAfterBrokerRestart: across restarts of the broker no
// message is lost: each lands in one partition's queue. RabbitMQ 3.10's
// consistent-hash exchange rebuilds its ring at boot in the order it
// recovers the queues, not the order they were bound in, and that order
// varies: after a restart subjects may go to other partitions than before
// (logged; the package's doc says so).
func TestPartitionsAfterBrokerRestart(t *testing.T) {
	t.Parallel()
	n := testserver.StartRabbitMQ(t)
	f := &partFixture{url: n.URL, topic: "parts.t" + randomSuffix(), consumer: "parts-c" + randomSuffix(), n: 12}
	// The same events each round, from a transport closed before the
	// broker stops; what each round added to each partition.
	var total []int
	round := func() []int {
		tr, err := New(TransportConfig{URL: n.URL})
		require.NoError(t, err)
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, tr.Connect(ctx))
		sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: f.consumer, Types: []string{f.topic}, Partitions: f.n})
		require.NoError(t, err)
		require.NoError(t, sub.Initialize())
		f.publish(t, tr, subjects("s", 240), 1)
		counts := f.counts(t)
		added := make([]int, f.n)
		sum := 0
		for i := range counts {
			if total != nil {
				added[i] = counts[i] - total[i]
			} else {
				added[i] = counts[i]
			}
			sum += added[i]
		}
		require.Equal(t, 240, sum, "every message in one partition's queue: %v", counts)
		total = counts
		return added
	}
	before := round()
	for range 2 {
		n.Stop(t)
		n.Start(t)
		after := round()
		if !slices.Equal(before, after) {
			t.Logf("the restart moved subjects: %v per partition, then %v", before, after)
		}
		before = after
	}
}

// TestPartitionsWithoutPlugin: on a broker without the consistent-hash
// exchange plugin, initializing a partitioned consumer fails with
// ErrNoConsistentHash, which names the command that enables it, and the
// transport's connection stays up: its publisher and its other consumers
// go on (the broker closes the connection that asks for an unknown
// exchange type).
func TestPartitionsWithoutPlugin(t *testing.T) {
	t.Parallel()
	n := testserver.StartRabbitMQWith(t) // no plugin
	tr := newTransport(t, TransportConfig{URL: n.URL})
	topic := "parts.t" + randomSuffix()
	plain, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "parts-plain" + randomSuffix(), Types: []string{topic}})
	require.NoError(t, err)
	require.NoError(t, plain.Initialize())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := plain.Subscriber.Subscribe(ctx, plain.Topics[0])
	require.NoError(t, err)

	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "parts-c" + randomSuffix(), Types: []string{topic}, Partitions: 4})
	require.NoError(t, err)
	err = sub.Initialize()
	require.ErrorIs(t, err, ErrNoConsistentHash)
	require.ErrorContains(t, err, "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange")
	_, err = sub.Subscriber.Subscribe(ctx, topic)
	require.ErrorIs(t, err, ErrNoConsistentHash)

	require.True(t, tr.Ready())
	require.NoError(t, tr.Publisher().Publish(topic, partEvent(t, topic, "s", "after", 1)))
	m := receive(t, ch)
	require.Equal(t, "after", m.UUID, "the consumer on the same connection goes on")
	m.Ack()
}
