package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// waitingOf returns the messages waiting in each partition of backlogs.
func waitingOf(backlogs []driver.PartitionBacklog) []int64 {
	out := make([]int64, len(backlogs))
	for i, b := range backlogs {
		out[i] = b.Waiting
	}
	return out
}

// TestBacklogsPartitioned: the backlog of each partition of a consumer is
// the rows of its partition after its position, in each of the
// consumer's topics; nothing before the consumer subscribed; the
// partitions that acknowledge their messages go down to none, their
// positions forward, while the others keep theirs.
func TestBacklogsPartitioned(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, n = "backlogs", 4
	topics := []string{"backlogs.one", "backlogs.two"}
	tr := newTransport(t, db, url)

	before, err := tr.Backlogs(ctx, consumer, topics, n)
	require.NoError(t, err)
	require.Len(t, before, n)
	for p, b := range before {
		require.Equal(t, p, b.Partition)
		require.Zero(t, b.Waiting, "nothing before the consumer subscribed")
		require.Len(t, b.Topics, len(topics)+1, "each topic and the replay topic")
		for _, tb := range b.Topics {
			require.False(t, tb.Known, "no position yet: %+v", tb)
		}
	}

	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: topics, Concurrency: 4, Partitions: n})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	require.NoError(t, sub.Initialize())
	subjects := make([]string, 12)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("subject-%d", i)
	}
	want := make([]int64, n)
	wantIn := map[string][]int64{}
	for i, topic := range topics {
		wantIn[topic] = make([]int64, n)
		for subject, ids := range publishEvents(t, tr.Publisher(), topic, topic, 0, 30+10*i, subjects) {
			p := partitionOf(subject, n)
			want[p] += int64(len(ids))
			wantIn[topic][p] += int64(len(ids))
		}
	}
	backlogs, err := tr.Backlogs(ctx, consumer, topics, n)
	require.NoError(t, err)
	require.Equal(t, want, waitingOf(backlogs), "every message waits in its partition")
	for _, b := range backlogs {
		require.False(t, b.More)
		require.Len(t, b.Topics, 3)
		for _, tb := range b.Topics {
			require.Zero(t, tb.Position)
			if tb.Topic == pipeline.ReplayTopic(consumer) {
				require.Zero(t, tb.Waiting, "the replay topic, not subscribed yet")
				continue
			}
			require.True(t, tb.Known, "%+v", tb)
			require.Equal(t, wantIn[tb.Topic][b.Partition], tb.Waiting, "partition %d in %s", b.Partition, tb.Topic)
		}
	}

	// Partitions 0 and 1 consumed and acknowledged.
	a, ok := sub.Subscriber.(driver.Assigner)
	require.True(t, ok)
	for _, topic := range topics {
		ch, err := sub.Subscriber.Subscribe(ctx, topic)
		require.NoError(t, err)
		go func() {
			for msg := range ch {
				msg.Ack()
			}
		}()
	}
	require.NoError(t, a.Assign(ctx, []int{0, 1}))
	require.Positive(t, want[0]+want[1])
	require.Eventually(t, func() bool {
		backlogs, err = tr.Backlogs(ctx, consumer, topics, n)
		require.NoError(t, err)
		return backlogs[0].Waiting == 0 && backlogs[1].Waiting == 0
	}, 30*time.Second, 20*time.Millisecond, "the consumed partitions' backlogs go down to none")
	require.Equal(t, []int64{0, 0, want[2], want[3]}, waitingOf(backlogs), "the others' stay")
	for _, tb := range backlogs[0].Topics {
		if tb.Topic != pipeline.ReplayTopic(consumer) && wantIn[tb.Topic][0] > 0 {
			require.Positive(t, tb.Position, "the position moved forward in %s", tb.Topic)
		}
	}
	for _, tb := range backlogs[2].Topics {
		require.Zero(t, tb.Position, "partition 2 did not move in %s", tb.Topic)
	}
}

// TestBacklogsUnpartitioned: an unpartitioned consumer's backlog is
// partition 0's, its group's rows after its position, counted up to
// driver.BacklogCap and flagged past it.
func TestBacklogsUnpartitioned(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const consumer, topic = "flat", "flat.topic"
	tr := newTransport(t, db, url)
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	require.NoError(t, sub.Initialize())
	publishEvents(t, tr.Publisher(), topic, "f", 0, 5, []string{"a", "b"})
	for _, partitions := range []int{0, 1} {
		backlogs, err := tr.Backlogs(ctx, consumer, []string{topic}, partitions)
		require.NoError(t, err)
		require.Equal(t, []int64{5}, waitingOf(backlogs), "partitions %d", partitions)
		require.False(t, backlogs[0].More)
	}
	other, err := tr.Backlogs(ctx, "another", []string{topic}, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{0}, waitingOf(other), "another consumer's group has no row")

	// Rows inserted by hand, past the cap.
	_, err = db.ExecContext(ctx, `INSERT INTO `+postgres.MessagesTable("", topic)+` (uuid, payload, metadata, transaction_id)
		SELECT 'u-' || i, '{}', '{}', pg_current_xact_id() FROM generate_series(1, $1::int) AS i`, driver.BacklogCap)
	require.NoError(t, err)
	backlogs, err := tr.Backlogs(ctx, consumer, []string{topic}, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{driver.BacklogCap}, waitingOf(backlogs))
	require.True(t, backlogs[0].More, "past the cap")
	require.True(t, backlogs[0].Topics[0].More)

	_, err = tr.Backlogs(ctx, consumer, []string{topic}, driver.MaxPartitions+1)
	require.Error(t, err, "more partitions than a consumer may have")
}
