package amqp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// partFixture is a partitioned consumer of one event type on the test
// broker, with its topology deleted when the test ends.
type partFixture struct {
	url      string
	topic    string
	consumer string
	n        int
	quorum   bool // the partitions' queues are quorum queues
}

// newPartFixture names a consumer of n partitions of its own.
func newPartFixture(t *testing.T, n int) *partFixture {
	t.Helper()
	f := &partFixture{
		url:      testenv.Require(t, testenv.AMQPURLVar),
		topic:    "parts.t" + randomSuffix(),
		consumer: "parts-c" + randomSuffix(),
		n:        n,
	}
	t.Cleanup(func() { deletePartitions(t, f.url, f.consumer, f.topic) })
	return f
}

// subscribe returns the partitioned subscriber of the fixture's consumer
// on a transport of its own (a process of the consumer), initialized.
func (f *partFixture) subscribe(t *testing.T, concurrency int, settles bool) (*Transport, *partitionedSubscriber) {
	t.Helper()
	cfg := TransportConfig{URL: f.url, NackDelay: 20 * time.Millisecond}
	if f.quorum {
		cfg.QueueType = QueueQuorum
	}
	tr := newTransport(t, cfg)
	sub, err := tr.Subscribe(driver.SubscribeConfig{
		Consumer: f.consumer, Types: []string{f.topic}, Concurrency: concurrency, Partitions: f.n, Settles: settles,
	})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	require.Equal(t, []string{f.topic}, sub.Topics, "one router handler")
	p, ok := sub.Subscriber.(*partitionedSubscriber)
	require.True(t, ok, "a partitioned subscriber: %T", sub.Subscriber)
	var _ driver.Assigner = p
	return tr, p
}

// publish publishes, through tr's publisher, the events of seqs 1..perSubject
// of each of subjects, round robin, and returns them by id.
func (f *partFixture) publish(t *testing.T, tr *Transport, subjects []string, perSubject int) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for seq := 1; seq <= perSubject; seq++ {
		msgs := make([]*message.Message, 0, len(subjects))
		for _, s := range subjects {
			id := fmt.Sprintf("%s-%d", s, seq)
			msgs = append(msgs, partEvent(t, f.topic, s, id, seq))
			ids[id] = true
		}
		require.NoError(t, tr.Publisher().Publish(f.topic, msgs...))
	}
	return ids
}

// counts returns how many messages wait in each partition's queue.
func (f *partFixture) counts(t *testing.T) []int {
	t.Helper()
	conn, err := amqp091.Dial(f.url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	counts := make([]int, f.n)
	for i := range f.n {
		q, err := ch.QueueDeclarePassive(partitionQueue(f.consumer, i), true, false, false, false, nil)
		require.NoError(t, err)
		counts[i] = q.Messages
	}
	return counts
}

// partEvent returns the message of a CloudEvent of type typ, subject and id.
func partEvent(t *testing.T, typ, subject, id string, seq int) *message.Message {
	t.Helper()
	env := framework.Envelope{
		Attributes: framework.Attributes{ID: id, Source: "tests", Type: typ, Version: 1, Subject: subject, SubjectSeq: int64(seq)},
		Data:       json.RawMessage(`{}`),
	}
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	return msg
}

// seen is a message a reader was handed.
type seen struct {
	id, subject string
	seq         int64
	partition   int
	redelivered bool
	order       int    // among every message the test's readers were handed
	by          string // the reader's name
	header      bool   // it carried PartitionHeader
}

// readers record what the partitioned subscribers of a test hand out.
type readers struct {
	mu      sync.Mutex
	all     []seen
	byID    map[string]int
	settled map[string]bool
}

func newReaders() *readers { return &readers{byID: map[string]int{}, settled: map[string]bool{}} }

// read reads ch until it closes, records each message as by's and acks it
// after pause, then settles it with sub when settles.
func (r *readers) read(t *testing.T, by string, ch <-chan *message.Message, sub driver.Settler, settles bool, pause time.Duration) {
	for msg := range ch {
		env, err := framework.Decode(msg.Payload, 0)
		if err != nil {
			t.Errorf("decode %s: %v", msg.UUID, err)
			msg.Ack()
			continue
		}
		p, ok := driver.PartitionFromContext(msg.Context())
		if !ok {
			t.Errorf("%s carries no partition", env.ID)
		}
		header, hasHeader := msg.Metadata[PartitionHeader]
		if hasHeader && header != driver.PartitionKey(env.Subject, env.ID) {
			t.Errorf("%s: header %s is %q", env.ID, PartitionHeader, header)
		}
		r.mu.Lock()
		r.byID[env.ID]++
		r.all = append(r.all, seen{
			id: env.ID, subject: env.Subject, seq: env.SubjectSeq, partition: p,
			redelivered: msg.Metadata.Get(framework.MetadataRedelivered) == "true", order: len(r.all), by: by, header: hasHeader,
		})
		r.mu.Unlock()
		time.Sleep(pause)
		msg.Ack()
		if settles {
			sub.Settle(msg, true)
		}
		r.mu.Lock()
		r.settled[env.ID] = true
		r.mu.Unlock()
	}
}

// waitFor waits until every id of want was handed out.
func (r *readers) waitFor(t *testing.T, want map[string]bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for id := range want {
			if r.byID[id] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "every message handed out")
}

// snapshot returns what was handed out so far.
func (r *readers) snapshot() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// requireOnceInOrder checks that each message was handed out once, not as
// a redelivery, each subject's in one partition and in publish order.
func requireOnceInOrder(t *testing.T, all []seen) map[string]int {
	t.Helper()
	return requireOnce(t, all, false)
}

// requireOnce is requireOnceInOrder, redeliveries allowed when
// redelivered.
func requireOnce(t *testing.T, all []seen, redelivered bool) map[string]int {
	t.Helper()
	partitionOf := map[string]int{}
	last := map[string]int64{}
	ids := map[string]bool{}
	for _, s := range all {
		require.False(t, ids[s.id], "%s handed out twice", s.id)
		ids[s.id] = true
		require.True(t, redelivered || !s.redelivered, "%s redelivered", s.id)
		if p, ok := partitionOf[s.subject]; ok {
			require.Equal(t, p, s.partition, "subject %s in two partitions", s.subject)
		}
		partitionOf[s.subject] = s.partition
		require.Greater(t, s.seq, last[s.subject], "subject %s out of order at %s", s.subject, s.id)
		last[s.subject] = s.seq
	}
	return partitionOf
}

func subjects(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = prefix + strconv.Itoa(i)
	}
	return s
}

// TestPartitionsBySubject: the events of one subject all land in one
// partition's queue and come out in publish order, many subjects spread
// over every partition, each message carries its partition and the
// partition key header, and none comes twice.
func TestPartitionsBySubject(t *testing.T) {
	t.Parallel()
	f := newPartFixture(t, 4)
	tr, sub := f.subscribe(t, 4, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	_, err = sub.Subscribe(ctx, f.topic)
	require.Error(t, err, "a partitioned subscriber is subscribed once")
	require.NoError(t, sub.Assign(ctx, []int{0, 1, 2, 3}))
	r := newReaders()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.read(t, "a", ch, sub, false, 0)
	}()

	want := f.publish(t, tr, subjects("s", 100), 5)
	r.waitFor(t, want)
	time.Sleep(200 * time.Millisecond) // nothing more comes
	all := r.snapshot()
	require.Len(t, all, len(want))
	partitionOf := requireOnceInOrder(t, all)
	for _, s := range all {
		require.True(t, s.header, "%s published without %s", s.id, PartitionHeader)
	}
	perPartition := make([]int, f.n)
	for _, p := range partitionOf {
		perPartition[p]++
	}
	for p, n := range perPartition {
		require.Positive(t, n, "partition %d got no subject of 100: %v", p, perPartition)
	}
	require.Equal(t, []int{0, 0, 0, 0}, f.counts(t))
	require.NoError(t, sub.Close())
	<-done
}

// TestPartitionsAssignSubset: a subscriber assigned some partitions
// consumes only their queues; the messages of the others stay in theirs.
// Before Subscribe, Assign only records the partitions.
func TestPartitionsAssignSubset(t *testing.T) {
	t.Parallel()
	f := newPartFixture(t, 4)
	tr, sub := f.subscribe(t, 2, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, sub.Assign(ctx, []int{1, 3}))
	require.Error(t, sub.Assign(ctx, []int{4}), "no partition 4 of 4")
	want := f.publish(t, tr, subjects("s", 60), 2)
	ch, err := sub.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	r := newReaders()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.read(t, "a", ch, sub, true, 0)
	}()

	var counts []int
	require.Eventually(t, func() bool {
		counts = f.counts(t)
		return counts[1] == 0 && counts[3] == 0
	}, 30*time.Second, 20*time.Millisecond, "partitions 1 and 3 drained")
	time.Sleep(200 * time.Millisecond)
	counts = f.counts(t)
	all := r.snapshot()
	requireOnceInOrder(t, all)
	for _, s := range all {
		require.Contains(t, []int{1, 3}, s.partition, "%s of partition %d handed out", s.id, s.partition)
	}
	require.Positive(t, counts[0], "partition 0 keeps its messages")
	require.Positive(t, counts[2], "partition 2 keeps its messages")
	require.Equal(t, len(want), len(all)+counts[0]+counts[2], "every message in a queue or handed out: %v", counts)
	require.NoError(t, sub.Close())
	<-done
	require.Error(t, sub.Assign(ctx, []int{0}), "after Close")
}

// TestPartitionsReassign: partitions dropped by one process while it
// drains a backlog, then assigned to another, move without a message
// handed out twice or redelivered: Assign returns only once the first
// process handed out what the broker had sent it of them and settled all
// of it, and it hands out no more of them afterwards. Each subject keeps
// its order across the move.
func TestPartitionsReassign(t *testing.T) {
	t.Parallel()
	t.Run("Classic", func(t *testing.T) {
		t.Parallel()
		testReassign(t, newPartFixture(t, 4))
	})
	// A quorum queue of RabbitMQ 3.10 returns to the queue what it had
	// in flight to a consumer when it is cancelled: the next owner gets
	// those as redeliveries (a plain amqp091 client that cancels and
	// drains its deliveries sees the same). Still none is handed out
	// twice.
	t.Run("Quorum", func(t *testing.T) {
		t.Parallel()
		f := newPartFixture(t, 4)
		f.quorum = true
		testReassign(t, f)
	})
}

func testReassign(t *testing.T, f *partFixture) {
	trA, a := f.subscribe(t, 2, true)
	_, b := f.subscribe(t, 2, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chA, err := a.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	chB, err := b.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	r := newReaders()
	var wg sync.WaitGroup
	wg.Go(func() { r.read(t, "a", chA, a, true, 2*time.Millisecond) })
	wg.Go(func() { r.read(t, "b", chB, b, true, 2*time.Millisecond) })

	want := f.publish(t, trA, subjects("s", 50), 8) // a backlog
	require.NoError(t, a.Assign(ctx, []int{0, 1, 2, 3}))
	require.Eventually(t, func() bool { return len(r.snapshot()) >= 60 }, 30*time.Second, 5*time.Millisecond)
	// A first Assign whose ctx ends before the drop is done; the one
	// after it still waits for the drop (the runner calls again).
	short, cancelShort := context.WithTimeout(ctx, time.Millisecond)
	require.ErrorIs(t, a.Assign(short, []int{0, 1}), context.DeadlineExceeded)
	cancelShort()
	require.NoError(t, a.Assign(ctx, []int{0, 1}))
	dropped := 0 // what A handed out of partitions 2 and 3: all settled now
	r.mu.Lock()
	for _, s := range r.all {
		if s.by == "a" && s.partition >= 2 {
			dropped++
			require.True(t, r.settled[s.id], "%s of a dropped partition not settled when Assign returned", s.id)
		}
	}
	moved := len(r.all)
	r.mu.Unlock()
	require.Positive(t, dropped)
	require.NoError(t, b.Assign(ctx, []int{2, 3}))
	r.waitFor(t, want)
	time.Sleep(200 * time.Millisecond)

	all := r.snapshot()
	require.Len(t, all, len(want))
	requireOnce(t, all, f.quorum)
	movedOn := 0
	for _, s := range all[moved:] {
		if s.partition >= 2 {
			require.Equal(t, "b", s.by, "%s handed out by the process that dropped its partition", s.id)
			movedOn++
		}
	}
	require.Positive(t, movedOn, "partitions 2 and 3 went on at the other process")
	require.Equal(t, []int{0, 0, 0, 0}, f.counts(t))
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	wg.Wait()
}

// TestPartitionsReplay: a message replayed to a partitioned consumer goes
// through its consistent-hash exchange to the partition of its subject,
// from a transport that subscribed the consumer and from one that did
// not; another consumer of the type does not see it again.
func TestPartitionsReplay(t *testing.T) {
	t.Parallel()
	f := newPartFixture(t, 4)
	tr, sub := f.subscribe(t, 2, false)
	other := "parts-o" + randomSuffix()
	t.Cleanup(func() { deletePartitions(t, f.url, other) }) // its queue is named after it
	otherSub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: other, Types: []string{f.topic}})
	require.NoError(t, err)
	require.NoError(t, otherSub.Initialize())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	require.NoError(t, sub.Assign(ctx, []int{0, 1, 2, 3}))
	r := newReaders()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.read(t, "a", ch, sub, false, 0)
	}()
	want := f.publish(t, tr, subjects("s", 40), 1)
	r.waitFor(t, want)
	partitionOf := requireOnceInOrder(t, r.snapshot())

	stranger := newTransport(t, TransportConfig{URL: f.url})
	replayed := map[string]bool{}
	for i, s := range []string{"s1", "s2", "s3", "s4", "s5", "s6"} {
		via := tr
		if i%2 == 1 {
			via = stranger // knows the consumer by its exchange
		}
		id := s + "-replayed"
		require.NoError(t, via.Replay(ctx, f.consumer, partEvent(t, f.topic, s, id, 2)))
		replayed[id] = true
	}
	r.waitFor(t, replayed)
	for _, s := range r.snapshot() {
		if replayed[s.id] {
			require.Equal(t, partitionOf[s.subject], s.partition, "%s replayed to another partition than its subject's", s.id)
		}
	}
	otherCh, err := otherSub.Subscriber.Subscribe(ctx, otherSub.Topics[0])
	require.NoError(t, err)
	for range want {
		m := receive(t, otherCh)
		require.Contains(t, want, m.UUID, "the other consumer sees a replayed message")
		m.Ack()
	}
	select {
	case m := <-otherCh:
		t.Fatalf("the other consumer got %s", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, sub.Close())
	<-done
}

// TestPartitionsWithoutHeader: a message published without the partition
// header (a producer that does not set it) lands in one partition,
// always the same, and is handed out once.
func TestPartitionsWithoutHeader(t *testing.T) {
	t.Parallel()
	f := newPartFixture(t, 4)
	_, sub := f.subscribe(t, 2, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	require.NoError(t, sub.Assign(ctx, []int{0, 1, 2, 3}))
	r := newReaders()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.read(t, "a", ch, sub, false, 0)
	}()
	want := map[string]bool{}
	for i := range 6 {
		id := fmt.Sprintf("plain-%d", i)
		body, err := framework.Encode(framework.Envelope{
			Attributes: framework.Attributes{ID: id, Source: "tests", Type: f.topic, Version: 1, Subject: fmt.Sprintf("subject-%d", i), SubjectSeq: 1},
			Data:       json.RawMessage(`{}`),
		})
		require.NoError(t, err)
		testenv.PublishAMQP(t, f.url, f.topic, amqp091.Publishing{ContentType: framework.ContentType, MessageId: id, Body: body})
		want[id] = true
	}
	r.waitFor(t, want)
	time.Sleep(300 * time.Millisecond)
	all := r.snapshot()
	require.Len(t, all, len(want))
	requireOnceInOrder(t, all)
	for _, s := range all {
		require.False(t, s.header)
		require.Equal(t, all[0].partition, s.partition, "messages without the header in one partition")
	}
	require.Equal(t, []int{0, 0, 0, 0}, f.counts(t))
	require.NoError(t, sub.Close())
	<-done
}

// TestPartitionsFewer: a consumer initialized with fewer partitions than
// before unbinds the queues of those beyond: new messages go to its
// partitions only.
func TestPartitionsFewer(t *testing.T) {
	t.Parallel()
	f := newPartFixture(t, 4)
	tr, _ := f.subscribe(t, 1, false)
	f.publish(t, tr, subjects("before", 40), 1)
	before := f.counts(t)
	require.Positive(t, before[2]+before[3])

	f.n = 2
	tr, _ = f.subscribe(t, 1, false)
	f.publish(t, tr, subjects("after", 40), 1)
	f.n = 4
	after := f.counts(t)
	require.Equal(t, before[2:], after[2:], "partitions 2 and 3 get nothing new, and keep what they hold")
	require.Equal(t, 80, after[0]+after[1]+after[2]+after[3])
}

// TestPartitionHeader: the publishers' marshaler (Publish, PublishDeferred
// and Replay) sets PartitionHeader on a CloudEvent, its subject or else
// its id, over a stale value in the metadata, and not on another payload;
// or the key on the message's context (pipeline.PartitionKey).
func TestPartitionHeader(t *testing.T) {
	t.Parallel()
	conn, err := newConnection(TransportConfig{URL: "amqp://guest:guest@127.0.0.1:1/"})
	require.NoError(t, err)
	marshal := conn.publisherConfig().Marshaler
	require.IsType(t, framedMarshaler{}, newConfirmChannel(conn).cfg.Marshaler, "PublishDeferred's")

	msg := partEvent(t, "tests.t", "subject-1", "id-1", 1)
	msg.Metadata.Set(PartitionHeader, "stale")
	p, err := marshal.Marshal(msg)
	require.NoError(t, err)
	require.Equal(t, "subject-1", p.Headers[PartitionHeader])

	p, err = marshal.Marshal(partEvent(t, "tests.t", "", "id-2", 0))
	require.NoError(t, err)
	require.Equal(t, "id-2", p.Headers[PartitionHeader], "the id of an event without a subject")

	p, err = marshal.Marshal(message.NewMessage("u-1", []byte(`{"not":"an event"}`)))
	require.NoError(t, err)
	require.NotContains(t, p.Headers, PartitionHeader)

	// The key its publisher knew (the outbox relay's, from its row) is
	// taken as it is: the body is not decoded again.
	msg = message.NewMessage("u-2", []byte(`{"not":"an event"}`))
	msg.SetContext(pipeline.With(msg.Context(), pipeline.PartitionKey("known-1")))
	p, err = marshal.Marshal(msg)
	require.NoError(t, err)
	require.Equal(t, "known-1", p.Headers[PartitionHeader])
}

// deletePartitions deletes the queues and the exchange of a partitioned
// consumer, and the exchanges of topics, from the broker at url.
func deletePartitions(t *testing.T, url, consumer string, topics ...string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("delete the partitions of %s: %v", consumer, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete the partitions of %s: %v", consumer, err)
		return
	}
	for _, q := range append([]string{consumer}, partitionQueues(consumer)...) {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Logf("delete %s: %v", q, err)
			return
		}
	}
	for _, x := range append([]string{consumer + exchangeSuffix}, topics...) {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Logf("delete %s: %v", x, err)
			return
		}
	}
}

// partitionQueues returns the names of the queues of every partition
// consumer may have.
func partitionQueues(consumer string) []string {
	qs := make([]string, driver.MaxPartitions)
	for i := range qs {
		qs[i] = partitionQueue(consumer, i)
	}
	return qs
}
