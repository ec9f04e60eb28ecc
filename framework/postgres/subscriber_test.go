package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// concurrentSubscriber returns a new subscriber of consumer's group on
// tr, handing out up to concurrency messages of topic at once.
func concurrentSubscriber(t *testing.T, tr *postgres.Transport, consumer, topic string, concurrency int) message.Subscriber {
	t.Helper()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: concurrency})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Subscriber.Close() })
	return sub.Subscriber
}

// receive returns the next message of ch, failing the test when ctx ends
// first.
func receive(ctx context.Context, t *testing.T, ch <-chan *message.Message, what string) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "%s: the channel closed", what)
		return msg
	case <-ctx.Done():
		t.Fatalf("%s: no message", what)
		return nil
	}
}

func publishUUIDs(t *testing.T, pub message.Publisher, topic string, uuids ...string) {
	t.Helper()
	for _, id := range uuids {
		require.NoError(t, pub.Publish(topic, message.NewMessage(id, []byte(`{"id":"`+id+`"}`))))
	}
}

// storedOffset returns the group's acknowledged offset in topic.
func storedOffset(t *testing.T, db *sqlx.DB, topic, group string) int64 {
	t.Helper()
	var off int64
	require.NoError(t, db.Get(&off, `SELECT offset_acked FROM `+postgres.OffsetsTable("", topic)+` WHERE consumer_group = $1`, group))
	return off
}

// TestSubscriberAcksInOrder hands out four messages at once; the last
// three are acknowledged, the first is not when the subscriber stops. The
// group's position stays before the first (a later Ack never lets it be
// skipped): the next subscriber of the group delivers it again, and once
// everything is acknowledged the position is the last message's.
func TestSubscriberAcksInOrder(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "inorder", "inorder"
	first := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 4)
	ch, err := first.Subscribe(ctx, topic)
	require.NoError(t, err)
	publishUUIDs(t, newTransport(t, db, url).Publisher(), topic, "m1", "m2", "m3", "m4")
	held := make(map[string]*message.Message)
	for i := range 4 {
		msg := receive(ctx, t, ch, fmt.Sprintf("message %d of 4 handed out at once", i+1))
		held[msg.UUID] = msg
	}
	for _, id := range []string{"m4", "m3", "m2"} {
		held[id].Ack()
	}
	require.NoError(t, first.Close())
	require.Zero(t, storedOffset(t, db, topic, group), "the position did not move past the unacknowledged m1")

	second := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 4)
	ch, err = second.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receive(ctx, t, ch, "m1 again")
	require.Equal(t, "m1", msg.UUID)
	msg.Ack()
	for range 3 { // delivered again: at least once
		receive(ctx, t, ch, "m2..m4 again").Ack()
	}
	require.NoError(t, second.Close())
	var last int64
	require.NoError(t, db.Get(&last, `SELECT max("offset") FROM `+postgres.MessagesTable("", topic)))
	require.Equal(t, last, storedOffset(t, db, topic, group))
}

// TestSubscriberNackDoesNotBlock nacks the first of three messages: the
// others are handed out while it waits for ResendInterval, and it comes
// back after them.
func TestSubscriberNackDoesNotBlock(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	cfg := fastTransport
	cfg.URL = url
	cfg.ResendInterval = 3 * time.Second // far longer than handing out the others
	tr, err := postgres.New(context.Background(), db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "nack"
	ch, err := concurrentSubscriber(t, tr, "nack", topic, 2).Subscribe(ctx, topic)
	require.NoError(t, err)
	publishUUIDs(t, tr.Publisher(), topic, "a", "b", "c")
	a := receive(ctx, t, ch, "a")
	require.Equal(t, "a", a.UUID)
	b := receive(ctx, t, ch, "b, with a in flight")
	require.Equal(t, "b", b.UUID)
	a.Nack()
	c := receive(ctx, t, ch, "c, with a nacked")
	require.Equal(t, "c", c.UUID, "a nacked message does not hold back the others")
	b.Ack()
	c.Ack()
	again := receive(ctx, t, ch, "a again")
	require.Equal(t, "a", again.UUID)
	again.Ack()
}

// TestSubscriberStandby runs two processes of one group: one of them
// hands out every message while the other stands by (each message once),
// and the standby takes over when the active one stops.
func TestSubscriberStandby(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "standby", "standby"
	pub := newTransport(t, db, url).Publisher()
	subs := []message.Subscriber{
		concurrentSubscriber(t, newTransport(t, db, url), group, topic, 2),
		concurrentSubscriber(t, newTransport(t, db, url), group, topic, 2),
	}
	var (
		mu   sync.Mutex
		byID = make(map[string][]int) // uuid → the processes that received it
	)
	var wg sync.WaitGroup
	for i, sub := range subs {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		wg.Go(func() {
			for msg := range ch {
				mu.Lock()
				byID[msg.UUID] = append(byID[msg.UUID], i)
				mu.Unlock()
				msg.Ack()
			}
		})
	}
	received := func(n int) map[int]int {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(byID) >= n
		}, 20*time.Second, 10*time.Millisecond, "%d messages received", n)
		mu.Lock()
		defer mu.Unlock()
		per := make(map[int]int)
		for id, got := range byID {
			require.Len(t, got, 1, "%s received once", id)
			per[got[0]]++
		}
		return per
	}
	// One at a time, so that a subscriber that takes turns with the
	// other (as watermill-sql's do) shows.
	var per map[int]int
	for i := range 20 {
		publishUUIDs(t, pub, topic, fmt.Sprintf("s%02d", i))
		per = received(i + 1)
	}
	require.Len(t, per, 1, "one process hands out the group's messages: %v", per)
	var active int
	for p := range per {
		active = p
	}

	require.NoError(t, subs[active].Close())
	publishUUIDs(t, pub, topic, "after")
	require.Equal(t, map[int]int{active: 20, 1 - active: 1}, received(21), "the standby took over")
	cancel()
	wg.Wait()
}

// TestSubscriberHoldsNoTransaction holds a message of one consumer
// without acknowledging it while a message published afterwards, to
// another topic, reaches another consumer: the subscriber keeps no
// transaction open while a message is handled, which would hold back
// every message published after it began (see
// TestLongTransactionHoldsBackDelivery).
func TestSubscriberHoldsNoTransaction(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	tr := newTransport(t, db, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	slow, err := concurrentSubscriber(t, tr, "slow", "slow", 1).Subscribe(ctx, "slow")
	require.NoError(t, err)
	other, err := concurrentSubscriber(t, tr, "other", "other", 1).Subscribe(ctx, "other")
	require.NoError(t, err)
	publishUUIDs(t, tr.Publisher(), "slow", "held")
	held := receive(ctx, t, slow, "held")
	publishUUIDs(t, tr.Publisher(), "other", "behind")
	require.Equal(t, "behind", receive(ctx, t, other, "a message published while another is handled").UUID)
	held.Ack()
}

// TestSubscriberInteroperates shows that the subscriber reads and writes
// watermill-sql's tables as watermill-sql does: it receives what a plain
// watermill-sql publisher of another service inserts, and a plain
// watermill-sql subscriber of the same group resumes where it stopped.
func TestSubscriberInteroperates(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "interop", "interop"
	schema := wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: func(topic string) string { return postgres.MessagesTable("", topic) }}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: func(topic string) string { return postgres.OffsetsTable("", topic) }}
	plainPub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db.DB), wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	require.NoError(t, err)
	publishUUIDs(t, plainPub, topic, "p1", "p2")

	ours := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 2)
	ch, err := ours.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := map[string]bool{}
	for range 2 {
		msg := receive(ctx, t, ch, "a plain publisher's message")
		got[msg.UUID] = true
		msg.Ack()
	}
	require.Equal(t, map[string]bool{"p1": true, "p2": true}, got)
	require.NoError(t, ours.Close())

	publishUUIDs(t, plainPub, topic, "p3")
	plainSub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db.DB), wsql.SubscriberConfig{
		ConsumerGroup:  group,
		PollInterval:   20 * time.Millisecond,
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	defer plainSub.Close()
	plainCh, err := plainSub.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receive(ctx, t, plainCh, "p3 through a plain watermill-sql subscriber")
	require.Equal(t, "p3", msg.UUID, "the plain subscriber resumes after what ours acknowledged")
	msg.Ack()
}

// slowPollTransport returns a transport whose idle subscriptions poll
// every ten minutes: a message they receive within seconds woke them.
func slowPollTransport(t *testing.T, db *sqlx.DB, url string) *postgres.Transport {
	t.Helper()
	cfg := fastTransport
	cfg.URL = url
	cfg.PollInterval = 10 * time.Minute
	tr, err := postgres.New(context.Background(), db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// insertByHand inserts a message into topic's table with a plain INSERT,
// as a watermill-sql publisher of another service or psql would.
func insertByHand(t *testing.T, db *sqlx.DB, topic, id string) {
	t.Helper()
	_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
		` (uuid, payload, metadata, transaction_id) VALUES ($1, '{}', '{}', pg_current_xact_id())`, id)
	require.NoError(t, err)
}

// TestSubscriberWakesOnInsert subscribes two groups to a topic whose table
// exists already, with a poll every ten minutes. A plain INSERT through
// another connection reaches both within seconds: the trigger, added
// once to the existing table, woke them.
func TestSubscriberWakesOnInsert(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // far below the poll
	defer cancel()
	const topic = "wake"
	tr := slowPollTransport(t, db, url)
	publishUUIDs(t, tr.Publisher(), topic, "before") // creates the table, without the trigger
	var chs []<-chan *message.Message
	for _, group := range []string{"wake1", "wake2"} {
		ch, err := concurrentSubscriber(t, tr, group, topic, 2).Subscribe(ctx, topic)
		require.NoError(t, err)
		receive(ctx, t, ch, group+": the message there before").Ack() // read once: idle now
		chs = append(chs, ch)
	}
	var triggers int
	require.NoError(t, db.Get(&triggers, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::text::regclass AND NOT tgisinternal`,
		postgres.MessagesTable("", topic)))
	require.Equal(t, 1, triggers, "one trigger, however many subscribers")

	insertByHand(t, db, topic, "by-hand")
	for _, ch := range chs {
		msg := receive(ctx, t, ch, "a message inserted by hand, long before the next poll")
		require.Equal(t, "by-hand", msg.UUID)
		msg.Ack()
	}
}

// TestSubscriberWakeWaitsForOlderTransactions inserts a message while an
// older transaction is open: the notified read cannot see it yet (rows
// are read only below the oldest running transaction), and the
// subscription reads again shortly instead of waiting for its ten-minute
// poll, so the message arrives once the older transaction ends.
func TestSubscriberWakeWaitsForOlderTransactions(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // far below the poll
	defer cancel()
	const topic = "wakeolder"
	tr := slowPollTransport(t, db, url)
	publishUUIDs(t, tr.Publisher(), topic, "before")
	ch, err := concurrentSubscriber(t, tr, topic, topic, 1).Subscribe(ctx, topic)
	require.NoError(t, err)
	receive(ctx, t, ch, "the message there before").Ack()

	older, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = older.Rollback() }()
	_, err = older.Exec(`SELECT pg_current_xact_id()`) // takes a transaction id
	require.NoError(t, err)
	insertByHand(t, db, topic, "behind")
	time.Sleep(300 * time.Millisecond) // the notified read finds nothing
	require.NoError(t, older.Commit())
	msg := receive(ctx, t, ch, "the message once the older transaction ended")
	require.Equal(t, "behind", msg.UUID)
	msg.Ack()
}

// BenchmarkSubscriberIdleLatency measures how long a message published to
// an idle subscription takes to be handed out, with the default
// PollInterval:
//
//	go test -run '^$' -bench SubscriberIdleLatency -benchtime 50x ./framework/postgres/
func BenchmarkSubscriberIdleLatency(b *testing.B) {
	url := testenv.PostgresURL(b)
	db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 4})
	require.NoError(b, err)
	defer db.Close()
	tr, err := postgres.New(context.Background(), db, postgres.TransportConfig{URL: url})
	require.NoError(b, err)
	defer tr.Close()
	s, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "idle", Types: []string{"idle"}})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := s.Subscriber.Subscribe(ctx, "idle")
	require.NoError(b, err)
	var total time.Duration
	for i := 0; i < b.N; i++ {
		time.Sleep(150 * time.Millisecond) // idle: past a poll
		start := time.Now()
		require.NoError(b, tr.Publisher().Publish("idle", message.NewMessage(fmt.Sprint(i), []byte(`{}`))))
		(<-ch).Ack()
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/msg")
}

// BenchmarkSubscriberSlowHandlers measures how fast one consumer group
// drains a backlog when each message takes 5ms to handle, for several
// concurrencies:
//
//	go test -run '^$' -bench SubscriberSlowHandlers -benchtime 400x ./framework/postgres/
func BenchmarkSubscriberSlowHandlers(b *testing.B) {
	for _, concurrency := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("Concurrency%d", concurrency), func(b *testing.B) {
			url := testenv.PostgresURL(b)
			db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 4})
			require.NoError(b, err)
			defer db.Close()
			tr, err := postgres.New(context.Background(), db, postgres.TransportConfig{URL: url, PollInterval: 10 * time.Millisecond})
			require.NoError(b, err)
			defer tr.Close()
			s, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "slow", Types: []string{"slow"}, Concurrency: concurrency})
			require.NoError(b, err)
			msgs := make([]*message.Message, b.N)
			for i := range msgs {
				msgs[i] = message.NewMessage(fmt.Sprint(i), []byte(`{}`))
			}
			require.NoError(b, tr.Publisher().Publish("slow", msgs...))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ResetTimer()
			ch, err := s.Subscriber.Subscribe(ctx, "slow")
			require.NoError(b, err)
			var wg sync.WaitGroup
			for range b.N {
				msg := <-ch
				wg.Go(func() {
					time.Sleep(5 * time.Millisecond)
					msg.Ack()
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// redeliveredSaid returns what msg says of its past: "true", "false", or
// "" when it says nothing.
func redeliveredSaid(msg *message.Message) string {
	return msg.Metadata.Get(framework.MetadataRedelivered)
}

// terminateGroupHolder ends the PostgreSQL session that holds group's
// lock on topic, as if its process had died: no statement of the
// subscription runs after it.
func terminateGroupHolder(t *testing.T, db *sqlx.DB, topic, group string) {
	t.Helper()
	var ended []bool
	require.NoError(t, db.Select(&ended, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1::text::regclass::oid::text || '/' || $2::text, 0)`,
		postgres.OffsetsTable("", topic), group))
	require.Equal(t, []bool{true}, ended, "one session held the group's lock")
}

// waitAcked waits until group's acknowledged offset of topic reaches the
// message uuid.
func waitAcked(t *testing.T, db *sqlx.DB, topic, group, uuid string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var acked bool
		err := db.Get(&acked, `SELECT COALESCE(o.offset_acked, 0) >= m."offset" FROM `+postgres.OffsetsTable("", topic)+` o, `+
			postgres.MessagesTable("", topic)+` m WHERE o.consumer_group = $1 AND m.uuid = $2`, group, uuid)
		return err == nil && acked
	}, 10*time.Second, 10*time.Millisecond, "the ack of %s was not written", uuid)
}

// TestSubscriberSaysWhatIsRedelivered shows what a delivery says of its
// past, so that the delivery guard counts only what may be a redelivery:
// a message read for the first time is a first delivery ("false", even
// when its producer stored another word), one handed out before is a
// redelivery ("true"): after a nack, after a restart of the subscriber,
// and after its process died without a word (the group's handed-out
// position was written before the message was handed out). The messages
// a subscriber read ahead but never handed out are first deliveries for
// the next one.
func TestSubscriberSaysWhatIsRedelivered(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "redelivered", "redelivered"
	pub := newTransport(t, db, url).Publisher()
	publishUUIDs(t, pub, topic, "m1")
	_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+` (uuid, payload, metadata, transaction_id)
		VALUES ('m2', '{}', $1, pg_current_xact_id())`, `{"`+framework.MetadataRedelivered+`":"true"}`)
	require.NoError(t, err)
	publishUUIDs(t, pub, topic, "m3")

	first := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 1)
	ch, err := first.Subscribe(ctx, topic)
	require.NoError(t, err)
	m1 := receive(ctx, t, ch, "m1")
	require.Equal(t, "m1", m1.UUID)
	require.Equal(t, "false", redeliveredSaid(m1), "read for the first time")
	m1.Nack()
	m2 := receive(ctx, t, ch, "m2")
	require.Equal(t, "m2", m2.UUID)
	require.Equal(t, "false", redeliveredSaid(m2), "read for the first time; its producer's word is not taken")
	require.NoError(t, first.Close()) // m1 nacked and m2 in hand; m3 read, never handed out

	second := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 1)
	ch, err = second.Subscribe(ctx, topic)
	require.NoError(t, err)
	for _, want := range []struct{ id, said, why string }{
		{"m1", "true", "handed out before the restart"},
		{"m2", "true", "handed out before the restart"},
		{"m3", "false", "read ahead, never handed out"},
	} {
		msg := receive(ctx, t, ch, want.id)
		require.Equal(t, want.id, msg.UUID)
		require.Equal(t, want.said, redeliveredSaid(msg), "%s: %s", want.id, want.why)
		if want.id != "m3" {
			msg.Ack()
			continue
		}
		msg.Nack()
		msg = receive(ctx, t, ch, "m3 after its nack")
		require.Equal(t, "m3", msg.UUID)
		require.Equal(t, "true", redeliveredSaid(msg), "handed out again after a nack")
		msg.Ack()
	}
	// m3's ack is written when the subscription is idle, or with its next
	// read: wait for it, or the holder's death below may come first, and
	// m3 is rightly handed out again.
	waitAcked(t, db, topic, group, "m3")
	publishUUIDs(t, pub, topic, "m4")
	m4 := receive(ctx, t, ch, "m4")
	require.Equal(t, "false", redeliveredSaid(m4), "published after the restart")
	terminateGroupHolder(t, db, topic, group) // its process dies with m4 in hand
	require.NoError(t, second.Close())

	third := concurrentSubscriber(t, newTransport(t, db, url), group, topic, 1)
	ch, err = third.Subscribe(ctx, topic)
	require.NoError(t, err)
	m4 = receive(ctx, t, ch, "m4 after the takeover")
	require.Equal(t, "m4", m4.UUID)
	require.Equal(t, "true", redeliveredSaid(m4), "handed out by a process that died")
	m4.Ack()
}

// TestSubscriberUnknownHandedOut takes over a group whose handed-out
// position is unknown (its row was written before the subscriber kept
// one): the messages there then say nothing of their past (any process
// may have handed them out, and counted them), and those published after
// are first deliveries.
func TestSubscriberUnknownHandedOut(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "unknown", "unknown"
	tr := newTransport(t, db, url)
	sub := concurrentSubscriber(t, tr, group, topic, 1)
	require.NoError(t, sub.(message.SubscribeInitializer).SubscribeInitialize(topic))
	_, err := db.Exec(`UPDATE ` + postgres.OffsetsTable("", topic) + ` SET handed_out_transaction_id = NULL, handed_out_offset = NULL`)
	require.NoError(t, err)
	publishUUIDs(t, tr.Publisher(), topic, "before")

	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receive(ctx, t, ch, "the message there before")
	_, said := msg.Metadata[framework.MetadataRedelivered]
	require.False(t, said, "another process may have handed it out")
	msg.Ack()
	publishUUIDs(t, tr.Publisher(), topic, "after")
	msg = receive(ctx, t, ch, "the message published after")
	require.Equal(t, "false", redeliveredSaid(msg))
	msg.Ack()
}
