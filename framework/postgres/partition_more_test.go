package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestPartitionedRawRow inserts rows by hand, without their bucket (as
// the documented INSERT, a watermill-sql publisher of another service or
// psql do): each is delivered, by the owner of its subject's partition
// (its id's when it has no subject), with the messages the transport
// published on that subject, in order. A payload the bucket function
// cannot read as an object is in partition 0.
func TestPartitionedRawRow(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, topic, n = "raw", "raw.topic", 4
	tr := newTransport(t, db, url)
	rec := newReceiver()
	var wg sync.WaitGroup
	owners := [][]int{{0, 2}, {1, 3}}
	for i, parts := range owners {
		a, _, ch := partitioned(ctx, t, newTransport(t, db, url), consumer, topic, n)
		require.NoError(t, a.Assign(ctx, parts))
		rec.consume(t, &wg, i, ch)
	}
	subjects := subjectsOf(3, n, 1)
	subjects = append(subjects, subjectsOf(2, n, 1)...)
	insert := func(uuid string, payload []byte) {
		_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
			` (uuid, payload, metadata, transaction_id) VALUES ($1, $2, '{}', pg_current_xact_id())`, uuid, string(payload))
		require.NoError(t, err)
	}
	var order []string
	for i := range 6 {
		subject := subjects[i%2]
		id := fmt.Sprintf("m-%02d", i)
		if i%3 == 1 {
			insert(id, event(id, subject))
		} else {
			require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(id, event(id, subject))))
		}
		order = append(order, id)
	}
	idOnly := `{"specversion":"1.0","id":"no-subject","source":"test","type":"parts","eventversion":1,"data":{}}`
	insert("m-id", []byte(idOnly))
	insert("m-array", []byte(`[1, 2]`))
	var nulls int
	require.NoError(t, db.Get(&nulls, `SELECT count(*) FROM `+postgres.MessagesTable("", topic)+` WHERE bucket IS NULL`))
	require.Equal(t, 4, nulls, "the rows inserted by hand have no bucket")

	all := rec.wait(t, append(order, "m-id", "m-array")...)
	want := map[string]int{"m-id": partitionOf("no-subject", n), "m-array": 0}
	for i, id := range order {
		want[id] = partitionOf(subjects[i%2], n)
	}
	var received []string
	for _, g := range all {
		require.Equal(t, want[g.uuid], g.partition, "%s", g.uuid)
		require.Contains(t, owners[g.process], g.partition, "%s went to its partition's owner", g.uuid)
		if g.uuid != "m-id" && g.uuid != "m-array" {
			received = append(received, g.uuid)
		}
	}
	for _, subject := range subjects {
		var got, published []string
		for i, id := range order {
			if subjects[i%2] == subject {
				published = append(published, id)
			}
		}
		for _, id := range received {
			if want[id] == partitionOf(subject, n) {
				got = append(got, id)
			}
		}
		require.Equal(t, published, got, "%s's messages once each, in order", subject)
	}
	cancel()
	wg.Wait()
}

// TestPartitionedReplay replays messages to a partitioned consumer: each
// reaches the owner of its subject's partition, on the consumer's replay
// topic, in order.
func TestPartitionedReplay(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, topic, n = "replayed", "replayed.topic", 2
	tr := newTransport(t, db, url)
	rec := newReceiver()
	var wg sync.WaitGroup
	for i := range 2 {
		sub, err := newTransport(t, db, url).Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4, Partitions: n})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Subscriber.Close() })
		require.Equal(t, pipeline.ReplayTopic(consumer), sub.Topics[len(sub.Topics)-1])
		ch, err := sub.Subscriber.Subscribe(ctx, pipeline.ReplayTopic(consumer))
		require.NoError(t, err)
		require.NoError(t, sub.Subscriber.(driver.Assigner).Assign(ctx, []int{i}))
		rec.consume(t, &wg, i, ch)
	}
	subjects := []string{subjectsOf(0, n, 1)[0], subjectsOf(1, n, 1)[0]}
	var msgs []*message.Message
	var ids []string
	for i := range 10 {
		id := fmt.Sprintf("r-%02d", i)
		msgs = append(msgs, message.NewMessage(id, event(id, subjects[i%2])))
		ids = append(ids, id)
	}
	require.NoError(t, tr.Replay(ctx, consumer, msgs...))
	all := rec.wait(t, ids...)
	require.Len(t, all, len(ids))
	last := map[int]string{}
	for _, g := range all {
		i := 0
		_, _ = fmt.Sscanf(g.uuid, "r-%02d", &i)
		want := partitionOf(subjects[i%2], n)
		require.Equal(t, want, g.partition, "%s", g.uuid)
		require.Equal(t, want, g.process, "%s went to its partition's owner", g.uuid)
		require.Less(t, last[g.partition], g.uuid, "in order")
		last[g.partition] = g.uuid
	}
	cancel()
	wg.Wait()
}

// TestPartitionCountChange changes a consumer's partition count, from 1
// to 2, to 4 and back to 1, one process at a time: each count starts
// where the one before stopped, never before (what the consumer acked
// under the first count is never delivered again), losing nothing; what
// lay between the partitions' positions may come again. The rows of the
// old count are gone.
func TestPartitionCountChange(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const consumer, topic = "change", "change.topic"
	pub := newTransport(t, db, url).Publisher()
	subjects := []string{"s-0", "s-1", "s-2", "s-3", "s-4", "s-5"}
	covered := map[int]bool{}
	for _, s := range subjects {
		covered[partitionOf(s, 4)] = true
	}
	require.Len(t, covered, 4, "every partition of 4 gets messages, so each moves past those of 2")
	run := func(n, from int) map[string]int {
		t.Helper()
		sub, err := newTransport(t, db, url).Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4, Partitions: n})
		require.NoError(t, err)
		require.NoError(t, sub.Initialize())
		subCtx, stop := context.WithCancel(ctx)
		ch, err := sub.Subscriber.Subscribe(subCtx, topic)
		require.NoError(t, err)
		if a, ok := sub.Subscriber.(driver.Assigner); ok {
			all := make([]int, n)
			for p := range all {
				all[p] = p
			}
			require.NoError(t, a.Assign(ctx, all))
		}
		rec := newReceiver()
		var wg sync.WaitGroup
		rec.consume(t, &wg, 0, ch)
		var want []string
		for _, ids := range publishEvents(t, pub, topic, "m", from, 12, subjects) {
			want = append(want, ids...)
		}
		rec.wait(t, want...)
		time.Sleep(300 * time.Millisecond) // anything delivered again shows
		require.NoError(t, sub.Subscriber.Close())
		stop()
		wg.Wait()
		times := map[string]int{}
		for _, g := range rec.all {
			times[g.uuid]++
		}
		for _, id := range want {
			require.Equal(t, 1, times[id], "%s, published under %d partitions, received once", id, n)
		}
		return times
	}
	groups := func() []string {
		var g []string
		require.NoError(t, db.Select(&g, `SELECT consumer_group FROM `+postgres.OffsetsTable("", topic)+` ORDER BY 1`))
		return g
	}
	run(1, 0)
	require.Equal(t, []string{consumer}, groups())
	got := run(2, 12)
	for id := range got {
		require.GreaterOrEqual(t, id, "m-0012", "acked under 1 partition, %s came again", id)
	}
	require.Equal(t, []string{consumer + "#0/2", consumer + "#1/2"}, groups())
	got = run(4, 24)
	for id := range got {
		require.GreaterOrEqual(t, id, "m-0012", "acked under 1 partition, %s came again", id)
	}
	require.Equal(t, []string{consumer + "#0/4", consumer + "#1/4", consumer + "#2/4", consumer + "#3/4"}, groups())
	got = run(1, 36)
	for id := range got {
		require.GreaterOrEqual(t, id, "m-0024", "acked before the partitions of 2 were replaced, %s came again", id)
	}
	require.Equal(t, []string{consumer}, groups())
}

// TestPartitionOverlapStandsBy assigns every partition to two processes
// at once (as may happen for a moment while a partition changes owner):
// each partition has one reader at a time, its lock's holder, so each
// message is received once; when that process drops the partition, the
// other takes it over.
func TestPartitionOverlapStandsBy(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, topic, n = "overlap", "overlap.topic", 2
	pub := newTransport(t, db, url).Publisher()
	rec := newReceiver()
	var wg sync.WaitGroup
	procs := make([]driver.Assigner, 2)
	for i := range procs {
		a, _, ch := partitioned(ctx, t, newTransport(t, db, url), consumer, topic, n)
		require.NoError(t, a.Assign(ctx, []int{0, 1}))
		procs[i] = a
		rec.consume(t, &wg, i, ch)
	}
	subjects := []string{subjectsOf(0, n, 1)[0], subjectsOf(1, n, 1)[0]}
	var ids []string
	for _, published := range publishEvents(t, pub, topic, "a", 0, 40, subjects) {
		ids = append(ids, published...)
	}
	all := rec.wait(t, ids...)
	owner := map[int]int{}
	for _, g := range all {
		if o, ok := owner[g.partition]; ok {
			require.Equal(t, o, g.process, "partition %d has one reader", g.partition)
		}
		owner[g.partition] = g.process
	}
	// The reader of partition 0 drops it: the other reads it on.
	require.NoError(t, procs[owner[0]].Assign(ctx, []int{1}))
	for _, published := range publishEvents(t, pub, topic, "b", 40, 40, subjects) {
		ids = append(ids, published...)
	}
	rec.wait(t, ids...)
	time.Sleep(200 * time.Millisecond) // anything delivered again shows
	rec.mu.Lock()
	all = append([]got(nil), rec.all...)
	rec.mu.Unlock()
	times := map[string]int{}
	for _, g := range all {
		times[g.uuid]++
		if g.uuid >= "b" && g.partition == 0 {
			require.Equal(t, 1-owner[0], g.process, "%s: partition 0's other reader took over", g.uuid)
		}
	}
	for _, id := range ids {
		require.Equal(t, 1, times[id], "%s received once", id)
	}
	cancel()
	wg.Wait()
}
