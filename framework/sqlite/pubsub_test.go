package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// pubsubFullEnv, when "1", runs watermill's universal suite in full mode
// (make test-sqlite-pubsub); otherwise it runs in short mode.
const pubsubFullEnv = "EFFECTIVELY_PUBSUB_FULL"

func openPubSubTestDB(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "pubsub.db"),
		OpenConfig{BusyTimeout: time.Minute, MaxOpenConns: 16})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// universalPubSub returns the constructors the universal suite needs: a
// fresh Publisher and Subscriber on db per call.
func universalPubSub(db *sqlx.DB, n *Notifier) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	watch := time.Duration(0) // the default
	if n == nil {
		watch = -1 // off: polling alone
	}
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := NewPublisher(db, PublisherConfig{Notifier: n})
		require.NoError(t, err)
		sub, err := NewSubscriber(db, SubscriberConfig{
			ConsumerGroup: group,
			Notifier:      n,
			PollInterval:  10 * time.Millisecond,
			NackDelay:     5 * time.Millisecond,
			RetryInterval: 10 * time.Millisecond,
			LeaseDuration: time.Minute,
			WatchInterval: watch,
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
		})
		return pub, sub
	}
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		return withGroup(t, "")
	}, withGroup
}

func universalFeatures() tests.Features {
	return tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
		// Several messages are in flight per subscription and a nacked
		// message comes back later: no order, not even with one subscriber.
		GuaranteedOrder:                     false,
		GuaranteedOrderWithSingleSubscriber: false,
		// A sender cannot tell a lost message from a lost ack.
		ExactlyOnceDelivery: false,
		// A new subscriber of the same group continues where the group
		// is; only a new group reads the messages still kept.
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       os.Getenv(pubsubFullEnv) != "1",
	}
}

func TestPubSubUniversal(t *testing.T) {
	db := openPubSubTestDB(t)
	ctor, groupCtor := universalPubSub(db, NewNotifier())
	tests.TestPubSub(t, universalFeatures(), ctor, groupCtor)
}

// TestPubSubUniversalPolling runs the suite without a Notifier nor the
// watch: every message is found by polling.
func TestPubSubUniversalPolling(t *testing.T) {
	db := openPubSubTestDB(t)
	ctor, groupCtor := universalPubSub(db, nil)
	tests.TestPubSub(t, universalFeatures(), ctor, groupCtor)
}

// pubsubBundle is what the behaviour tests work with: one file, a
// Publisher and a way to make Subscribers on it.
type pubsubBundle struct {
	db       *sqlx.DB
	notifier *Notifier
	pub      *Publisher
	topic    string
}

func setupPubSub(t *testing.T) *pubsubBundle {
	t.Helper()
	db := openPubSubTestDB(t)
	n := NewNotifier()
	pub, err := NewPublisher(db, PublisherConfig{Notifier: n})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return &pubsubBundle{db: db, notifier: n, pub: pub, topic: "appointments.appointment.booked"}
}

// subscriber returns a Subscriber of group on the bundle's file with short
// intervals; cfg's non-zero fields win.
func (b *pubsubBundle) subscriber(t *testing.T, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	if cfg.Notifier == nil {
		cfg.Notifier = b.notifier
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.NackDelay == 0 {
		cfg.NackDelay = 10 * time.Millisecond
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 10 * time.Millisecond
	}
	sub, err := NewSubscriber(b.db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return sub
}

func (b *pubsubBundle) publish(t *testing.T, payloads ...string) []*message.Message {
	t.Helper()
	var msgs []*message.Message
	for _, p := range payloads {
		msg := message.NewMessage(watermill.NewUUID(), []byte(p))
		msg.Metadata.Set("k", "v-"+p)
		msgs = append(msgs, msg)
	}
	require.NoError(t, b.pub.Publish(b.topic, msgs...))
	return msgs
}

func (b *pubsubBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Get(&n, query, args...))
	return n
}

func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
		return nil
	}
}

func receiveNothing(t *testing.T, ch <-chan *message.Message, wait time.Duration) {
	t.Helper()
	select {
	case msg, ok := <-ch:
		if ok {
			t.Fatalf("unexpected message %s (%s)", msg.UUID, msg.Payload)
		}
	case <-time.After(wait):
	}
}

func redelivered(t *testing.T, msg *message.Message) bool {
	t.Helper()
	r, known := pipeline.Redelivered(msg)
	require.True(t, known, "metadata %s missing", framework.MetadataRedelivered)
	return r
}

func TestPubSubConfig(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		cfg := SubscriberConfig{}.WithDefaults()
		require.NoError(t, cfg.Validate())
		require.Equal(t, DefaultPollInterval, cfg.PollInterval)
		require.Equal(t, DefaultLeaseDuration, cfg.LeaseDuration)
		require.Equal(t, DefaultNackDelay, cfg.NackDelay)
		require.Equal(t, DefaultMaxInFlight, cfg.MaxInFlight)
		require.Equal(t, DefaultMaxInFlight, cfg.ClaimBatchSize)
		require.Equal(t, 64, SubscriberConfig{MaxInFlight: 64}.WithDefaults().ClaimBatchSize)
		require.Equal(t, DefaultAckFlushInterval, cfg.AckFlushInterval)
		require.Equal(t, DefaultPubSubCleanupInterval, cfg.CleanupInterval)
		require.Equal(t, DefaultWatchInterval, cfg.WatchInterval)
		require.NotNil(t, cfg.Logger)
		require.NoError(t, PublisherConfig{}.WithDefaults().Validate())
	})
	t.Run("ErrorsNameTheField", func(t *testing.T) {
		for field, cfg := range map[string]SubscriberConfig{
			"TablePrefix":      {TablePrefix: "Bad-Prefix"},
			"LeaseDuration":    {LeaseDuration: -time.Second},
			"PollInterval":     {PollInterval: -1},
			"MaxInFlight":      {MaxInFlight: -1},
			"CleanupBatchSize": {CleanupBatchSize: -5},
		} {
			err := cfg.WithDefaults().Validate()
			require.ErrorContains(t, err, "SubscriberConfig."+field)
		}
		_, err := NewPublisher(openPubSubTestDB(t), PublisherConfig{TablePrefix: "1x"})
		require.ErrorContains(t, err, "PublisherConfig.TablePrefix")
		_, err = NewSubscriber(nil, SubscriberConfig{})
		require.ErrorIs(t, err, ErrMissingDB)
	})
	t.Run("CleanupOff", func(t *testing.T) {
		cfg := SubscriberConfig{CleanupInterval: -1}.WithDefaults()
		require.NoError(t, cfg.Validate())
		require.Negative(t, cfg.CleanupInterval)
	})
}

func TestPubSubTablePrefix(t *testing.T) {
	t.Parallel()
	db := openPubSubTestDB(t)
	pub, err := NewPublisher(db, PublisherConfig{TablePrefix: "app_"})
	require.NoError(t, err)
	sub, err := NewSubscriber(db, SubscriberConfig{TablePrefix: "app_", PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	defer sub.Close()

	require.NoError(t, pub.Publish("t", message.NewMessage("1", []byte("x"))))
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	receive(t, ch).Ack()

	var tables []string
	require.NoError(t, db.Select(&tables,
		`SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%pubsub%' ORDER BY name`))
	require.Equal(t, []string{"app_pubsub_groups", "app_pubsub_leases", "app_pubsub_messages"}, tables)
}

func TestPubSubDelivery(t *testing.T) {
	t.Parallel()

	t.Run("MetadataRoundTripsAndFirstDeliveryIsNotRedelivered", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		sent := b.publish(t, "a")
		ch, err := b.subscriber(t, SubscriberConfig{}).Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)
		require.Equal(t, sent[0].UUID, msg.UUID)
		require.Equal(t, "a", string(msg.Payload))
		require.Equal(t, "v-a", msg.Metadata.Get("k"))
		require.False(t, redelivered(t, msg))
		require.True(t, msg.Ack())
	})

	t.Run("NackRedelivers", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		ch, err := b.subscriber(t, SubscriberConfig{NackDelay: 100 * time.Millisecond}).
			Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		first := receive(t, ch)
		require.False(t, redelivered(t, first))
		nackedAt := time.Now()
		first.Nack()
		again := receive(t, ch)
		require.GreaterOrEqual(t, time.Since(nackedAt), 100*time.Millisecond, "redelivered before NackDelay")
		require.Equal(t, first.UUID, again.UUID)
		require.True(t, redelivered(t, again))
		again.Ack()
		receiveNothing(t, ch, 200*time.Millisecond)
	})

	t.Run("CrashedHolderLeaseExpires", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		// The holder, a process of its own (a pool of its own on the
		// file), takes the message and dies: its pool closes under it, so
		// it neither renews nor releases the lease. The lease expires and
		// another subscription of the group gets the message.
		var path string
		require.NoError(t, b.db.Get(&path, `SELECT file FROM pragma_database_list WHERE name = 'main'`))
		crashed, err := Open(context.Background(), path, OpenConfig{})
		require.NoError(t, err)
		holder, err := NewSubscriber(crashed, SubscriberConfig{LeaseDuration: 300 * time.Millisecond, PollInterval: 10 * time.Millisecond})
		require.NoError(t, err)
		held, err := holder.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		first := receive(t, held)
		require.False(t, redelivered(t, first))
		require.NoError(t, crashed.Close())

		other := b.subscriber(t, SubscriberConfig{LeaseDuration: time.Minute})
		ch, err := other.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		again := receive(t, ch)
		require.Equal(t, first.UUID, again.UUID)
		require.True(t, redelivered(t, again))
		again.Ack()
		require.NoError(t, holder.Close()) // its writes fail: the pool is gone
		require.NoError(t, other.Close())
		require.Zero(t, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
	})

	t.Run("LeaseRenewedWhileHandled", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		// Handling takes three leases: the holder renews the lease, so
		// the other subscription of the group never gets the message,
		// which is acked once. A lease of 1s (renewed every 333ms) is
		// short enough to expire three times over, and long enough that
		// a loaded machine does not delay two renewals in a row past it
		// (with 300ms, make test failed this once).
		holder := b.subscriber(t, SubscriberConfig{LeaseDuration: time.Second})
		held, err := holder.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, held)
		require.False(t, redelivered(t, msg))

		other := b.subscriber(t, SubscriberConfig{LeaseDuration: time.Minute})
		ch, err := other.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		receiveNothing(t, ch, 3*time.Second)
		msg.Ack()
		require.NoError(t, holder.Close())
		require.Zero(t, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
		receiveNothing(t, ch, 300*time.Millisecond)
		receiveNothing(t, held, 0)
	})

	t.Run("RenewalLeavesALeaseTakenOver", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		// MaxInFlight 1: holding the message, the holder claims no other,
		// not even this one again.
		holder := b.subscriber(t, SubscriberConfig{LeaseDuration: 300 * time.Millisecond, MaxInFlight: 1})
		held, err := holder.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		first := receive(t, held)
		// Another process took the message over after the lease expired
		// (its claim counted a delivery) and has since let its own lease
		// expire: the holder's renewals must not take it back.
		_, err = b.db.Exec(`UPDATE pubsub_leases SET deliveries = deliveries + 1, locked_until = 1`)
		require.NoError(t, err)
		time.Sleep(time.Second) // three renewal periods of the holder

		other := b.subscriber(t, SubscriberConfig{LeaseDuration: time.Minute})
		ch, err := other.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		again := receive(t, ch)
		require.Equal(t, first.UUID, again.UUID)
		require.True(t, redelivered(t, again))
		again.Ack()
		first.Ack() // late: the lease is gone already; harmless
	})

	t.Run("SlowMessageWithinLeaseIsNotRedelivered", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		sub := b.subscriber(t, SubscriberConfig{LeaseDuration: time.Minute})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)
		receiveNothing(t, ch, 300*time.Millisecond)
		msg.Ack()
	})

	t.Run("SeveralInFlight", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "1", "2", "3", "4", "5")
		ch, err := b.subscriber(t, SubscriberConfig{MaxInFlight: 4}).Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		var held []*message.Message
		for range 4 {
			held = append(held, receive(t, ch))
		}
		receiveNothing(t, ch, 100*time.Millisecond) // MaxInFlight reached
		for _, m := range held {
			m.Ack()
		}
		receive(t, ch).Ack()
	})

	t.Run("ConsumerGroupsEachGetEveryMessage", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		a, err := b.subscriber(t, SubscriberConfig{ConsumerGroup: "a"}).Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		c, err := b.subscriber(t, SubscriberConfig{ConsumerGroup: "c"}).Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		sent := b.publish(t, "x")
		for _, ch := range []<-chan *message.Message{a, c} {
			msg := receive(t, ch)
			require.Equal(t, sent[0].UUID, msg.UUID)
			msg.Ack()
		}
	})
}

// TestPubSubHandInsert publishes the way docs/transports.md tells another
// program to: one INSERT of the CloudEvent into pubsub_messages.
func TestPubSubHandInsert(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "notifications.remind-on-appointment-booked"})
	require.NoError(t, sub.SubscribeInitialize(b.topic)) // creates the tables

	const event = `{"specversion":"1.0","id":"evt-1","source":"appointments",` +
		`"type":"appointments.appointment.booked","eventversion":1,"subject":"appt-7",` +
		`"subjectseq":"1","time":"2026-01-02T03:04:05Z","data":{"appointment_id":"appt-7"}}`
	_, err := b.db.Exec(`INSERT INTO pubsub_messages (topic, uuid, payload, metadata)
		VALUES (?, ?, CAST(? AS BLOB), ?)`,
		"appointments.appointment.booked", "evt-1", event, `{"content-type":"application/cloudevents+json"}`)
	require.NoError(t, err)

	ch, err := sub.Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	msg := receive(t, ch)
	require.Equal(t, "evt-1", msg.UUID)
	require.Equal(t, framework.ContentType, msg.Metadata.Get(framework.MetadataContentType))
	require.False(t, redelivered(t, msg))
	env, err := driver.DecodeMessage(msg, 0)
	require.NoError(t, err)
	require.Equal(t, framework.Key{Source: "appointments", ID: "evt-1"}, env.Key())
	require.Equal(t, "appointments.appointment.booked", env.Type)
	msg.Ack()
	require.NoError(t, sub.Close())
	require.Zero(t, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
}

// TestPubSubUnreadableMetadata inserts rows by hand whose metadata is not
// a JSON object of strings: each is delivered marked unreadable, keeping
// its stored metadata, to be dead-lettered like on the postgres
// transport, and never with metadata nobody published.
func TestPubSubUnreadableMetadata(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "c"})
	require.NoError(t, sub.SubscribeInitialize(b.topic))
	rows := []struct{ uuid, metadata, unreadable string }{
		{"number", `{"n":1}`, "metadata value is not a string"},
		{"array", `["a"]`, "metadata is not a JSON object"},
		{"text", `not json`, "metadata is not a JSON object"},
		{"fine", `{"k":"v","gone":null}`, ""},
	}
	for _, r := range rows {
		_, err := b.db.Exec(`INSERT INTO pubsub_messages (topic, uuid, payload, metadata) VALUES (?, ?, CAST(? AS BLOB), ?)`,
			b.topic, r.uuid, `{"a":1}`, r.metadata)
		require.NoError(t, err)
	}
	ch, err := sub.Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	for _, r := range rows {
		msg := receive(t, ch)
		require.Equal(t, r.uuid, msg.UUID)
		require.Equal(t, r.unreadable, msg.Metadata.Get(framework.MetadataUnreadable))
		if r.unreadable != "" {
			require.Equal(t, r.metadata, msg.Metadata.Get(framework.MetadataUnreadableRaw))
			_, err := driver.DecodeMessage(msg, 0)
			require.Equal(t, framework.CodeUnreadableMessage, framework.CodeOf(err))
		} else {
			require.Equal(t, "v", msg.Metadata.Get("k"))
			require.NotContains(t, msg.Metadata, "gone")
		}
		msg.Ack()
	}
}

// TestPubSubOddCreatedAt inserts rows by hand whose created_at is not
// Unix milliseconds as an integer: SQLite keeps whatever a producer
// writes in an INTEGER column, and julianday's arithmetic without the
// default's CAST gives a real. Each row is delivered, with its time when
// one can be read, and the backlog is read too: a created_at that failed
// the read stopped the topic for every consumer.
func TestPubSubOddCreatedAt(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	tr, err := New(b.db, TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	sub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "c"})
	require.NoError(t, sub.SubscribeInitialize(b.topic))
	const millis = 1796613208355
	rows := []struct {
		uuid      string
		createdAt any
		published string
	}{
		{"real", float64(millis) + 0.99, time.UnixMilli(millis).UTC().Format(time.RFC3339Nano)},
		{"text", "abc", ""},
		{"blob", []byte{0xff, 0}, ""},
		{"huge", 1e300, ""},
		{"negative", -5, ""},
		{"fine", millis, time.UnixMilli(millis).UTC().Format(time.RFC3339Nano)},
	}
	for _, r := range rows {
		_, err := b.db.Exec(`INSERT INTO pubsub_messages (topic, uuid, payload, metadata, created_at) VALUES (?, ?, CAST(? AS BLOB), '{}', ?)`,
			b.topic, r.uuid, `{"a":1}`, r.createdAt)
		require.NoError(t, err)
	}
	ctx := context.Background()
	backlog, err := tr.Backlogs(ctx, "c", []string{b.topic}, 1)
	require.NoError(t, err, "the backlog reads the rows' times")
	require.EqualValues(t, len(rows), backlog[0].Waiting)
	ch, err := sub.Subscribe(ctx, b.topic)
	require.NoError(t, err)
	for _, r := range rows {
		msg := receive(t, ch)
		require.Equal(t, r.uuid, msg.UUID)
		require.Equal(t, r.published, msg.Metadata.Get(framework.MetadataPublishedAt), "row %s", r.uuid)
		_, err := tr.Backlogs(ctx, "c", []string{b.topic}, 1)
		require.NoError(t, err, "the backlog reads the leased rows' times")
		msg.Ack()
	}
}

// pubsubTestMarks keeps processed marks in a table of the test's file: the
// unit of work calls only Mark (no delivery is counted here), so the rest
// of driver.Store is left nil.
type pubsubTestMarks struct{ driver.Store }

func (pubsubTestMarks) Mark(ctx context.Context, tx *driver.Tx, consumer string, key framework.Key) (bool, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO test_marks (consumer, source, id) VALUES (?, ?, ?)
		ON CONFLICT DO NOTHING`, consumer, key.Source, key.ID)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// TestPubSubClaimsFillTheFreeSlots shows that a subscription holding
// nothing claims its whole MaxInFlight in one write transaction (a trigger
// counts the moves of the group's claimed offset, one per claim of new
// messages), not in several smaller ones.
func TestPubSubClaimsFillTheFreeSlots(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "g", MaxInFlight: 64, CleanupInterval: -1})
	require.NoError(t, sub.SubscribeInitialize(b.topic))
	_, err := b.db.Exec(`CREATE TABLE test_claims (claimed_offset INTEGER NOT NULL);
		CREATE TRIGGER test_count_claims AFTER UPDATE OF claimed_offset ON pubsub_groups
		BEGIN INSERT INTO test_claims VALUES (NEW.claimed_offset); END`)
	require.NoError(t, err)
	payloads := make([]string, 64)
	for i := range payloads {
		payloads[i] = strconv.Itoa(i)
	}
	b.publish(t, payloads...)

	msgs, err := sub.Subscribe(t.Context(), b.topic)
	require.NoError(t, err)
	for range 64 {
		receive(t, msgs) // held: none acked, so no claim follows
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM test_claims`), "claim transactions")
	require.Equal(t, 64, b.count(t, `SELECT count(*) FROM pubsub_leases WHERE consumer_group = 'g'`))
}

func TestPubSubAckInTx(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*pubsubBundle, *driver.UnitOfWork) {
		b := setupPubSub(t)
		_, err := b.db.Exec(`CREATE TABLE test_marks (consumer TEXT, source TEXT, id TEXT, PRIMARY KEY (consumer, source, id));
			CREATE TABLE test_parents (id TEXT PRIMARY KEY);
			CREATE TABLE test_effects (id TEXT PRIMARY KEY,
				parent TEXT REFERENCES test_parents (id) DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: pubsubTestMarks{}})
		require.NoError(t, err)
		return b, uow
	}
	// handle handles msg as the consumer chain given sub as its
	// middleware.Config.Acker does: with the ack of msg in the attempt.
	handle := func(t *testing.T, uow *driver.UnitOfWork, sub *Subscriber, db *sqlx.DB, msg *message.Message, parent any, fail error) (framework.Outcome, error) {
		ack, ok := sub.TxAck(msg)
		require.True(t, ok, "a message of the subscriber has its ack")
		d := driver.Delivery{Ack: ack}
		return uow.DoDelivery(msg.Context(), "c", framework.Key{Source: "s", ID: msg.UUID}, d, func(ctx context.Context) error {
			if _, err := framework.Conn(ctx, db).ExecContext(ctx,
				`INSERT INTO test_effects (id, parent) VALUES (?, ?)`, msg.UUID, parent); err != nil {
				return err
			}
			return fail
		})
	}

	t.Run("CommitAcksWithTheEffect", func(t *testing.T) {
		t.Parallel()
		b, uow := setup(t)
		b.publish(t, "a")
		sub := b.subscriber(t, SubscriberConfig{})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)

		outcome, err := handle(t, uow, sub, b.db, msg, nil, nil)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, outcome)
		// The lease went with the commit, before the router's Ack.
		require.Zero(t, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
		require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM test_effects`))
		msg.Ack()
		require.NoError(t, sub.Close())

		// After a restart nothing comes back.
		ch, err = b.subscriber(t, SubscriberConfig{}).Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		receiveNothing(t, ch, 300*time.Millisecond)
	})

	t.Run("RollbackRedelivers", func(t *testing.T) {
		t.Parallel()
		b, uow := setup(t)
		b.publish(t, "a")
		sub := b.subscriber(t, SubscriberConfig{})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)

		outcome, err := handle(t, uow, sub, b.db, msg, nil, errors.New("handler failed"))
		require.Error(t, err)
		require.Equal(t, framework.Failed, outcome)
		require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
		msg.Nack()

		again := receive(t, ch)
		require.Equal(t, msg.UUID, again.UUID)
		require.True(t, redelivered(t, again))
		outcome, err = handle(t, uow, sub, b.db, again, nil, nil)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, outcome)
		again.Ack()
		require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM test_effects`))
	})

	t.Run("FailedCommitAfterAckRedelivers", func(t *testing.T) {
		t.Parallel()
		b, uow := setup(t)
		b.publish(t, "a")
		sub := b.subscriber(t, SubscriberConfig{})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)

		// The deferred foreign key fails the COMMIT, after the ack ran in
		// the transaction: the ack rolls back with the effect.
		outcome, err := handle(t, uow, sub, b.db, msg, "no-such-parent", nil)
		require.ErrorContains(t, err, "FOREIGN KEY")
		require.Equal(t, framework.Failed, outcome)
		require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
		msg.Nack()

		again := receive(t, ch)
		require.Equal(t, msg.UUID, again.UUID)
		require.True(t, redelivered(t, again))
		again.Ack()
	})

	t.Run("BatchAcksWithItsEffects", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		_, err := b.db.Exec(`CREATE TABLE test_marks (consumer TEXT, source TEXT, id TEXT, PRIMARY KEY (consumer, source, id));
			CREATE TABLE test_effects (id TEXT PRIMARY KEY, parent TEXT)`)
		require.NoError(t, err)
		// One batch of all four: the acks of the three that take effect
		// are written in its transaction (one statement), the failing
		// one's lease stays.
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{
			DB: b.db, Store: pubsubTestMarks{}, BatchSize: 4, Batches: 1, Linger: 5 * time.Second,
		})
		require.NoError(t, err)
		b.publish(t, "a", "b", "c", "d")
		sub := b.subscriber(t, SubscriberConfig{})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msgs := make([]*message.Message, 4)
		for i := range msgs {
			msgs[i] = receive(t, ch)
		}
		outcomes := make([]framework.Outcome, 4)
		var wg sync.WaitGroup
		for i, msg := range msgs {
			wg.Go(func() {
				var fail error
				if string(msg.Payload) == "c" {
					fail = errors.New("c fails")
				}
				outcomes[i], _ = handle(t, uow, sub, b.db, msg, nil, fail)
			})
		}
		wg.Wait()
		for i, msg := range msgs {
			want := framework.Processed
			if string(msg.Payload) == "c" {
				want = framework.Failed
			}
			require.Equal(t, want, outcomes[i], string(msg.Payload))
		}
		// Before the router's Ack or Nack: the leases of a, b and d went
		// with the batch's commit.
		require.Equal(t, 3, b.count(t, `SELECT COUNT(*) FROM test_effects`))
		var left []int64
		require.NoError(t, b.db.Select(&left, `SELECT "offset" FROM pubsub_leases`))
		require.Len(t, left, 1, "only c's lease is left")
		for _, msg := range msgs {
			if string(msg.Payload) == "c" {
				msg.Nack()
			} else {
				msg.Ack()
			}
		}
		again := receive(t, ch)
		require.Equal(t, "c", string(again.Payload))
		again.Ack()
	})

	// Only a message the subscriber handed out has its ack: a chain given
	// the subscriber as its Acker leaves another's message to the router.
	t.Run("OnlyItsOwnMessages", func(t *testing.T) {
		t.Parallel()
		b := setupPubSub(t)
		b.publish(t, "a")
		sub := b.subscriber(t, SubscriberConfig{})
		ch, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
		msg := receive(t, ch)
		ack, ok := sub.TxAck(msg)
		require.True(t, ok)
		require.Same(t, b.db.DB, ack.DB, "acked in a transaction of the subscriber's database")

		other := b.subscriber(t, SubscriberConfig{ConsumerGroup: "other"})
		_, ok = other.TxAck(msg)
		require.False(t, ok, "a message of another subscriber")
		_, ok = sub.TxAck(message.NewMessage("x", nil))
		require.False(t, ok, "a message of no subscriber")
		other.Settle(msg, true) // ignored: not its message
		require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
		msg.Ack()
	})
}

func TestPubSubCleanup(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	fast := b.subscriber(t, SubscriberConfig{ConsumerGroup: "fast", CleanupInterval: -1})
	slow := b.subscriber(t, SubscriberConfig{ConsumerGroup: "slow", CleanupInterval: -1})
	require.NoError(t, fast.SubscribeInitialize(b.topic))
	require.NoError(t, slow.SubscribeInitialize(b.topic))
	// A topic no group is registered for keeps its messages.
	require.NoError(t, b.pub.Publish("nobody.listens", message.NewMessage("n", []byte("x"))))
	b.publish(t, "1", "2", "3", "4", "5", "6")

	consume := func(ch <-chan *message.Message, n int) {
		for range n {
			receive(t, ch).Ack()
		}
	}
	fastCh, err := fast.Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	consume(fastCh, 6)
	require.NoError(t, fast.Close()) // writes the buffered acks

	n, err := slow.Cleanup(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "slow acked nothing yet")

	slowSub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "slow", MaxInFlight: 3, ClaimBatchSize: 3, CleanupInterval: -1})
	slowCh, err := slowSub.Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	var held []*message.Message
	for range 3 {
		held = append(held, receive(t, slowCh))
	}
	held[0].Ack()
	held[2].Ack() // the second stays unacked: only the first can go
	var deleted int64
	require.Eventually(t, func() bool { // once the acks are written
		n, err := slow.Cleanup(context.Background())
		require.NoError(t, err)
		deleted += n
		return deleted > 0
	}, 5*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 1, deleted)

	held[1].Ack()
	consume(slowCh, 3)
	require.NoError(t, slowSub.Close())
	n, err = slow.Cleanup(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	require.Zero(t, b.count(t, `SELECT COUNT(*) FROM pubsub_leases`))
	require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM pubsub_messages`))
	require.Equal(t, 1, b.count(t, `SELECT COUNT(*) FROM pubsub_messages WHERE topic = 'nobody.listens'`))
}

func TestPubSubCleanupRunsPeriodically(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{CleanupInterval: 20 * time.Millisecond})
	b.publish(t, "1", "2")
	ch, err := sub.Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	receive(t, ch).Ack()
	receive(t, ch).Ack()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT COUNT(*) FROM pubsub_messages`) == 0
	}, 5*time.Second, 10*time.Millisecond)
}

// TestPubSubRestart closes the subscriber and the database mid-way and
// reopens them: every message arrives, none is lost.
func TestPubSubRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "restart.db")
	const topic, total = "t", 100
	open := func() *sqlx.DB {
		db, err := Open(context.Background(), path, OpenConfig{})
		require.NoError(t, err)
		return db
	}

	db := open()
	pub, err := NewPublisher(db, PublisherConfig{})
	require.NoError(t, err)
	want := map[string]bool{}
	for i := range total {
		msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		want[msg.UUID] = true
		require.NoError(t, pub.Publish(topic, msg))
	}
	require.NoError(t, pub.Close())

	got := map[string]bool{}
	sub, err := NewSubscriber(db, SubscriberConfig{PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	for i := range 40 {
		msg := receive(t, ch)
		if i%4 == 0 {
			msg.Nack() // handled nowhere: must come back
			continue
		}
		got[msg.UUID] = true
		msg.Ack()
	}
	require.NoError(t, sub.Close())
	require.NoError(t, db.Close())

	db = open()
	defer db.Close()
	sub, err = NewSubscriber(db, SubscriberConfig{PollInterval: 10 * time.Millisecond, NackDelay: time.Millisecond})
	require.NoError(t, err)
	defer sub.Close()
	ch, err = sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	for len(got) < total {
		msg := receive(t, ch)
		got[msg.UUID] = true
		msg.Ack()
	}
	require.Equal(t, want, got)
}

// TestPubSubNotifierWakes shows that a subscription wakes on a publish in
// the same process long before its next poll.
func TestPubSubNotifierWakes(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	ch, err := b.subscriber(t, SubscriberConfig{PollInterval: time.Hour}).Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	receiveNothing(t, ch, 50*time.Millisecond) // the first look found nothing
	start := time.Now()
	b.publish(t, "a")
	receive(t, ch).Ack()
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestPubSubWatchSeesOtherProcesses shows that a message another process
// inserts (here through a pool of its own, with no Notifier, as a foreign
// INSERT) is claimed by a subscription that would not poll for an hour:
// the Subscriber's watch of the newest offset wakes it.
func TestPubSubWatchSeesOtherProcesses(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	ch, err := b.subscriber(t, SubscriberConfig{PollInterval: time.Hour}).Subscribe(context.Background(), b.topic)
	require.NoError(t, err)
	receiveNothing(t, ch, 50*time.Millisecond) // the first look found nothing
	var path string
	require.NoError(t, b.db.Get(&path, `SELECT file FROM pragma_database_list WHERE name = 'main'`))
	other, err := Open(context.Background(), path, OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.Close()) })
	_, err = other.Exec(`INSERT INTO pubsub_messages (topic, uuid, payload) VALUES (?, 'evt-1', CAST('{}' AS BLOB))`, b.topic)
	require.NoError(t, err)
	msg := receive(t, ch)
	require.Equal(t, "evt-1", msg.UUID)
	msg.Ack()
}

// TestPubSubWatchShared shows that the Subscribers sharing a Notifier and
// a db share one watch, which stops when the last of them closes.
func TestPubSubWatchShared(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	watches := func() int {
		b.notifier.mu.Lock()
		defer b.notifier.mu.Unlock()
		return len(b.notifier.watches)
	}
	one, two := b.subscriber(t, SubscriberConfig{ConsumerGroup: "one"}), b.subscriber(t, SubscriberConfig{ConsumerGroup: "two"})
	require.Zero(t, watches(), "no watch before a subscription")
	for _, sub := range []*Subscriber{one, two} {
		_, err := sub.Subscribe(context.Background(), b.topic)
		require.NoError(t, err)
	}
	require.Equal(t, 1, watches())
	require.NoError(t, one.Close())
	require.Equal(t, 1, watches(), "two still subscribes")
	require.NoError(t, two.Close())
	require.Zero(t, watches())
}

func TestPubSubClosed(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{})
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	_, err := sub.Subscribe(context.Background(), b.topic)
	require.ErrorIs(t, err, ErrSubscriberClosed)
	_, err = b.subscriber(t, SubscriberConfig{}).Subscribe(context.Background(), "")
	require.ErrorIs(t, err, ErrEmptyTopic)

	pub, err := NewPublisher(b.db, PublisherConfig{})
	require.NoError(t, err)
	require.NoError(t, pub.Close())
	require.ErrorIs(t, pub.Publish(b.topic, message.NewMessage("1", nil)), ErrPublisherClosed)
}

// TestPubSubHandsOutClaimedAheadWhileItsWritesWait shows that a
// subscription holds half a claim batch claimed beyond MaxInFlight, and
// hands it out as soon as an ack frees a slot, even while its write of
// that ack (and its next claim) waits for the file's write lock: the
// batches of the messages in flight must not run dry meanwhile.
func TestPubSubHandsOutClaimedAheadWhileItsWritesWait(t *testing.T) {
	t.Parallel()
	b := setupPubSub(t)
	sub := b.subscriber(t, SubscriberConfig{ConsumerGroup: "g", MaxInFlight: 4, ClaimBatchSize: 2, CleanupInterval: -1})
	require.NoError(t, sub.SubscribeInitialize(b.topic))
	b.publish(t, "1", "2", "3", "4", "5", "6", "7", "8")
	msgs, err := sub.Subscribe(t.Context(), b.topic)
	require.NoError(t, err)
	var held []*message.Message
	for range 4 {
		held = append(held, receive(t, msgs))
	}
	require.Eventually(t, func() bool { // the fifth claimed ahead
		return b.count(t, `SELECT count(*) FROM pubsub_leases WHERE consumer_group = 'g'`) == 5
	}, 10*time.Second, 5*time.Millisecond)
	receiveNothing(t, msgs, 50*time.Millisecond) // MaxInFlight reached

	tx, err := b.db.Beginx() // holds the write lock
	require.NoError(t, err)
	held[0].Ack() // its write waits for the lock, with the next claim
	fifth := receive(t, msgs)
	require.Equal(t, "5", string(fifth.Payload))
	require.NoError(t, tx.Rollback())

	for _, m := range append(held[1:], fifth) {
		m.Ack()
	}
	for _, want := range []string{"6", "7", "8"} {
		m := receive(t, msgs)
		require.Equal(t, want, string(m.Payload))
		m.Ack()
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pubsub_leases WHERE consumer_group = 'g'`) == 0
	}, 10*time.Second, 5*time.Millisecond)
}
