package amqp

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestBacklogsPartitioned: the backlog of each partition of a consumer is
// the messages ready in its queue, as the broker reports them; a consumer
// whose queues do not exist has nothing waiting; a transport not
// connected says so.
func TestBacklogsPartitioned(t *testing.T) {
	t.Parallel()
	const n = 4
	f := newPartFixture(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr, _ := f.subscribe(t, 4, false)
	none, err := tr.Backlogs(ctx, "nobody-"+randomSuffix(), nil, n)
	require.NoError(t, err)
	require.Len(t, none, n)
	for p, b := range none {
		require.Equal(t, driver.PartitionBacklog{Partition: p}, b, "no queue, nothing waits")
	}

	subjects := []string{"s-a", "s-b", "s-c", "s-d", "s-e", "s-f", "s-g", "s-h"}
	f.publish(t, tr, subjects, 5) // nothing consumes: no partition assigned
	var backlogs []driver.PartitionBacklog
	require.Eventually(t, func() bool {
		backlogs, err = tr.Backlogs(ctx, f.consumer, []string{f.topic}, n)
		require.NoError(t, err)
		var sum int64
		for _, b := range backlogs {
			sum += b.Waiting
		}
		return sum == int64(len(subjects)*5)
	}, 30*time.Second, 20*time.Millisecond, "every message waits in a partition's queue")
	counts := f.counts(t)
	for p, b := range backlogs {
		require.Equal(t, p, b.Partition)
		require.EqualValues(t, counts[p], b.Waiting, "partition %d: the queue's count", p)
		require.False(t, b.More)
		require.Empty(t, b.Topics, "RabbitMQ keeps no position")
	}
	require.Greater(t, slices.MaxFunc(backlogs, func(a, b driver.PartitionBacklog) int { return int(a.Waiting - b.Waiting) }).Waiting,
		int64(0))

	off, err := New(TransportConfig{URL: f.url})
	require.NoError(t, err)
	t.Cleanup(func() { _ = off.Close() })
	_, err = off.Backlogs(ctx, f.consumer, nil, n)
	require.ErrorIs(t, err, ErrNotConnected)
}

// TestBacklogsUnpartitioned: an unpartitioned consumer's backlog is
// partition 0's, its queue's ready messages.
func TestBacklogsUnpartitioned(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	consumer, topic := "flat-c"+randomSuffix(), "flat.t"+randomSuffix()
	t.Cleanup(func() { deletePartitions(t, url, consumer, topic) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr := newTransport(t, TransportConfig{URL: url})
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	require.NoError(t, sub.Initialize())
	for i := range 5 {
		require.NoError(t, tr.Publisher().Publish(topic, partEvent(t, topic, "s", "e-"+randomHex(), i+1)))
	}
	require.Eventually(t, func() bool {
		backlogs, err := tr.Backlogs(ctx, consumer, []string{topic}, 1)
		require.NoError(t, err)
		require.Len(t, backlogs, 1)
		return backlogs[0].Waiting == 5
	}, 30*time.Second, 20*time.Millisecond, "the queue's five messages")
	_, err = tr.Backlogs(ctx, consumer, nil, driver.MaxPartitions+1)
	require.Error(t, err)
}
