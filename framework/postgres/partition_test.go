package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// event returns the payload of an event of subject, numbered seq.
func event(id, subject string) []byte {
	return []byte(fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"test","type":"parts","subject":%q,"eventversion":1,"data":{}}`, id, subject))
}

// partitionOf returns the partition of subject among n.
func partitionOf(subject string, n int) int {
	return driver.PartitionOf(driver.Bucket(driver.PartitionKey(subject, "")), n)
}

// got is a message a process received.
type got struct {
	process   int
	partition int
	uuid      string
	// publishedAt is its framework.MetadataPublishedAt.
	publishedAt string
}

// receiver records what the processes receive, acking each message as
// it arrives, unless hold says to keep it.
type receiver struct {
	mu   sync.Mutex
	all  []got
	held chan *message.Message
	hold func(*message.Message) bool
}

func newReceiver() *receiver {
	return &receiver{held: make(chan *message.Message, 100), hold: func(*message.Message) bool { return false }}
}

// consume receives ch as process until it closes.
func (r *receiver) consume(t *testing.T, wg *sync.WaitGroup, process int, ch <-chan *message.Message) {
	wg.Go(func() {
		for msg := range ch {
			p, ok := driver.PartitionFromContext(msg.Context())
			if !ok {
				p = -1
			}
			r.mu.Lock()
			r.all = append(r.all, got{process: process, partition: p, uuid: msg.UUID, publishedAt: msg.Metadata.Get(framework.MetadataPublishedAt)})
			hold := r.hold(msg)
			r.mu.Unlock()
			if hold {
				r.held <- msg
				continue
			}
			msg.Ack()
		}
	})
}

// wait waits until the uuids were all received, and returns everything
// received so far.
func (r *receiver) wait(t *testing.T, uuids ...string) []got {
	t.Helper()
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		seen := make(map[string]bool, len(r.all))
		for _, g := range r.all {
			seen[g.uuid] = true
		}
		for _, id := range uuids {
			if !seen[id] {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "every message received")
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// partitioned subscribes consumer, of n partitions, to topic on tr and
// returns its assigner and its messages.
func partitioned(ctx context.Context, t *testing.T, tr *postgres.Transport, consumer, topic string, n int) (driver.Assigner, driver.Subscription, <-chan *message.Message) {
	t.Helper()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4, Partitions: n})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	a, ok := sub.Subscriber.(driver.Assigner)
	require.True(t, ok, "a partitioned subscriber is an Assigner")
	require.NoError(t, sub.Initialize())
	ch, err := sub.Subscriber.Subscribe(ctx, topic)
	require.NoError(t, err)
	return a, sub, ch
}

// publishEvents publishes count events spread over subjects, numbered
// from first, and returns their uuids, by subject in publish order.
func publishEvents(t *testing.T, pub message.Publisher, topic, prefix string, first, count int, subjects []string) map[string][]string {
	t.Helper()
	bySubject := make(map[string][]string)
	for i := first; i < first+count; i++ {
		subject := subjects[i%len(subjects)]
		id := fmt.Sprintf("%s-%04d", prefix, i)
		require.NoError(t, pub.Publish(topic, message.NewMessage(id, event(id, subject))))
		bySubject[subject] = append(bySubject[subject], id)
	}
	return bySubject
}

// TestPartitionedConsumers runs two processes of one consumer of four
// partitions, each with a transport and connections of its own. Nothing
// is consumed until they are assigned; then each receives the messages of
// its partitions only (each message's context says which), together every
// message once, each subject's in publish order, each telling when it was
// published. A partition handed over from one to the other loses nothing
// and delivers nothing again.
func TestPartitionedConsumers(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, topic, n = "parts", "parts.topic", 4
	pub := newTransport(t, db, url).Publisher()
	subjects := make([]string, 16)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("subject-%d", i)
	}
	owners := [2][]int{{0, 1}, {2, 3}}
	procs := [2]driver.Assigner{}
	rec := newReceiver()
	var wg sync.WaitGroup
	for i := range procs {
		a, _, ch := partitioned(ctx, t, newTransport(t, db, url), consumer, topic, n)
		procs[i] = a
		rec.consume(t, &wg, i, ch)
	}
	start := time.Now()
	first := publishEvents(t, pub, topic, "a", 0, 160, subjects)
	time.Sleep(300 * time.Millisecond)
	rec.mu.Lock()
	require.Empty(t, rec.all, "nothing is consumed before the partitions are assigned")
	rec.mu.Unlock()
	for i, a := range procs {
		require.NoError(t, a.Assign(ctx, owners[i]))
	}
	byUUID := make(map[string]string)
	var uuids []string
	add := func(published map[string][]string) {
		for subject, ids := range published {
			for _, id := range ids {
				byUUID[id] = subject
				uuids = append(uuids, id)
			}
		}
	}
	// check checks what was received: every message once, by the owner
	// of its partition (owner), each subject's in publish order.
	check := func(all []got, owner func(uuid string, partition int) int) {
		t.Helper()
		times := make(map[string]int)
		order := make(map[string][]string)
		for _, g := range all {
			times[g.uuid]++
			subject, ok := byUUID[g.uuid]
			require.True(t, ok, "%s was published", g.uuid)
			want := partitionOf(subject, n)
			require.Equal(t, want, g.partition, "%s of %s carries its partition", g.uuid, subject)
			require.Equal(t, owner(g.uuid, want), g.process, "%s of partition %d went to its owner", g.uuid, want)
			order[subject] = append(order[subject], g.uuid)
			at, err := time.Parse(time.RFC3339Nano, g.publishedAt)
			require.NoError(t, err, "%s tells when it was published", g.uuid)
			require.WithinRange(t, at, start.Add(-5*time.Second), time.Now().Add(time.Second), "%s published", g.uuid)
		}
		require.Len(t, times, len(uuids), "every message received")
		for id, k := range times {
			require.Equal(t, 1, k, "%s received once", id)
		}
		for subject, ids := range order {
			require.True(t, slices.IsSorted(ids), "%s's messages in publish order: %v", subject, ids)
		}
	}
	add(first)
	all := rec.wait(t, uuids...)
	check(all, func(_ string, p int) int { return p / 2 })
	perProcess := map[int]int{}
	for _, g := range all {
		perProcess[g.process]++
	}
	require.Len(t, perProcess, 2, "both processes consume: %v", perProcess)

	// Partition 1 moves from process 0 to process 1.
	require.NoError(t, procs[0].Assign(ctx, []int{0}))
	require.NoError(t, procs[1].Assign(ctx, []int{1, 2, 3}))
	add(publishEvents(t, pub, topic, "b", 160, 160, subjects))
	rec.wait(t, uuids...)
	time.Sleep(300 * time.Millisecond) // anything delivered again shows
	rec.mu.Lock()
	all = slices.Clone(rec.all)
	rec.mu.Unlock()
	check(all, func(uuid string, p int) int {
		if uuid < "b" {
			return p / 2
		}
		return min(p, 1)
	})
	cancel()
	wg.Wait()
}

// subjectsOf returns count subjects of partition p among n.
func subjectsOf(p, n, count int) []string {
	var out []string
	for i := 0; len(out) < count; i++ {
		if s := fmt.Sprintf("subject-%d", i); partitionOf(s, n) == p {
			out = append(out, s)
		}
	}
	return out
}

// TestAssignWaitsForSettles drops a partition while its messages are in
// hand: Assign returns only once they are settled, and the partition's
// next owner starts after them, delivering none of them again; the first
// process hands out nothing more of it.
func TestAssignWaitsForSettles(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumer, topic, n = "settles", "settles.topic", 4
	pub := newTransport(t, db, url).Publisher()
	rec := newReceiver()
	rec.hold = func(*message.Message) bool { return true }
	var wg sync.WaitGroup
	first, _, ch := partitioned(ctx, t, newTransport(t, db, url), consumer, topic, n)
	rec.consume(t, &wg, 0, ch)
	second, _, ch := partitioned(ctx, t, newTransport(t, db, url), consumer, topic, n)
	rec.consume(t, &wg, 1, ch)
	require.NoError(t, first.Assign(ctx, []int{0, 1}))
	subjects := subjectsOf(1, n, 2)
	published := publishEvents(t, pub, topic, "a", 0, 4, subjects)
	var held []*message.Message
	for range 4 { // concurrency 4: all in hand at once
		select {
		case msg := <-rec.held:
			held = append(held, msg)
		case <-ctx.Done():
			t.Fatal("the messages were not handed out")
		}
	}

	// A first Assign whose ctx ends before the drop is done; the one
	// after it still waits for the drop (the runner calls again).
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	require.ErrorIs(t, first.Assign(short, []int{0}), context.DeadlineExceeded)
	cancelShort()
	assigned := make(chan error, 1)
	go func() { assigned <- first.Assign(ctx, []int{0}) }()
	select {
	case err := <-assigned:
		t.Fatalf("Assign returned (%v) while the dropped partition's messages were in hand", err)
	case <-time.After(300 * time.Millisecond):
	}
	for _, msg := range held {
		msg.Ack()
	}
	select {
	case err := <-assigned:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Assign did not return once the messages were settled")
	}

	rec.mu.Lock()
	rec.hold = func(*message.Message) bool { return false }
	rec.mu.Unlock()
	require.NoError(t, second.Assign(ctx, []int{1}))
	later := publishEvents(t, pub, topic, "b", 4, 2, subjects)
	var want []string
	for _, ids := range later {
		want = append(want, ids...)
	}
	rec.wait(t, want...)
	time.Sleep(200 * time.Millisecond) // anything delivered again shows
	rec.mu.Lock()
	all := slices.Clone(rec.all)
	rec.mu.Unlock()
	times := map[string]int{}
	for _, g := range all {
		times[g.uuid]++
		if g.uuid >= "b" {
			require.Equal(t, 1, g.process, "%s: the partition's new owner hands it out", g.uuid)
		}
	}
	for _, ids := range published {
		for _, id := range ids {
			require.Equal(t, 1, times[id], "%s acked before the handover, never delivered again", id)
		}
	}
	require.Len(t, times, 6)
	cancel()
	wg.Wait()
}
