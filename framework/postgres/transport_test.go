package postgres_test

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// fastTransport polls and resends quickly, for tests.
var fastTransport = postgres.TransportConfig{PollInterval: 20 * time.Millisecond, ResendInterval: 50 * time.Millisecond}

func open(t *testing.T, url string, conns int) *sqlx.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: conns})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newTransport returns a transport publishing on db, its subscribers on a
// pool of their own at url, closed at the end of the test.
func newTransport(t *testing.T, db *sqlx.DB, url string) *postgres.Transport {
	t.Helper()
	cfg := fastTransport
	cfg.URL = url
	tr, err := postgres.New(context.Background(), db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// subscriber returns a new subscriber of consumer's group on tr.
func subscriber(t *testing.T, tr *postgres.Transport, consumer string) message.Subscriber {
	t.Helper()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{consumer}})
	require.NoError(t, err)
	return sub.Subscriber
}

// postgresEnv returns the conformance suite's Env on the database at url:
// the transport publishes on one pool, its subscribers have a pool of
// their own.
func postgresEnv(t *testing.T, url string) *transporttest.Env {
	t.Helper()
	db := open(t, url, 20)
	cfg := fastTransport
	cfg.URL = url
	tr, err := postgres.New(context.Background(), db, cfg)
	require.NoError(t, err)
	return &transporttest.Env{
		Transport:      tr,
		SettleReported: true,
		PublishRaw: func(t *testing.T, topic string, body []byte) {
			// The documented format of a message inserted by hand.
			_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
				` (uuid, payload, metadata, transaction_id) VALUES ($1, $2, '{}', pg_current_xact_id())`,
				"hand-"+watermill.NewShortUUID(), string(body))
			require.NoError(t, err)
		},
		PublishRow: func(_ *testing.T, topic string, body []byte, metadata string) error {
			_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
				` (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())`,
				"hand-"+watermill.NewShortUUID(), string(body), metadata)
			return err
		},
		StoresJSON: true,
	}
}

// TestTransport runs the transport conformance suite: what the
// PostgreSQL transport does by itself, without the consumer chain.
func TestTransport(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
		return postgresEnv(t, testenv.PostgresURL(t))
	})
}

// TestTransportAdoptGroup runs the renamed consumer's case of the
// conformance suite.
func TestTransportAdoptGroup(t *testing.T) {
	t.Parallel()
	transporttest.ExerciseAdoptGroup(t, func(t *testing.T) *transporttest.Env {
		return postgresEnv(t, testenv.PostgresURL(t))
	})
}

func TestTransportNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"watermill_appointments.appointment.booked"`, postgres.MessagesTable("", "appointments.appointment.booked"))
	require.Equal(t, `"app_watermill_offsets_a.b"`, postgres.OffsetsTable("app_", "a.b"))
	long := postgres.MessagesTable("", pipeline.ReplayTopic(strings.Repeat("x", 120)))
	require.Len(t, strings.Trim(long, `"`), 63, "cut to PostgreSQL's limit")
	require.NotEqual(t, long, postgres.MessagesTable("", pipeline.ReplayTopic(strings.Repeat("x", 119)+"y")), "distinct names stay distinct")
	_, err := postgres.New(context.Background(), nil, postgres.TransportConfig{})
	require.Error(t, err)
	_, err = postgres.New(context.Background(), testenv.Postgres(t), postgres.TransportConfig{BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize")
}

// TestTransportLongNames publishes and consumes with a topic whose table
// name exceeds 63 bytes and an event id longer than the uuid column.
func TestTransportLongNames(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	tr := newTransport(t, db, url)
	pub := tr.Publisher()
	sub := subscriber(t, tr, "c")
	topic := pipeline.ReplayTopic("notifications." + strings.Repeat("remind-", 14) + "x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	id := strings.Repeat("i", 200)
	msg := message.NewMessage(id, []byte(`{"a":1}`))
	msg.Metadata.Set(framework.MetadataRedelivered, "true")
	require.NoError(t, pub.Publish(topic, msg))
	select {
	case got := <-ch:
		require.Len(t, got.UUID, 36, "a long UUID is replaced by one derived from it")
		require.JSONEq(t, `{"a":1}`, string(got.Payload))
		require.Equal(t, "false", got.Metadata.Get(framework.MetadataRedelivered), "the transport's word on redelivery, never the producer's")
		got.Ack()
	case <-ctx.Done():
		t.Fatal("no message")
	}
}

// TestLongTransactionHoldsBackDelivery shows the limit docs/transports.md
// names: watermill-sql delivers only messages whose transaction is older
// than every transaction still running, so a transaction left open holds
// back what is published after it began, on every topic, until it ends.
// Transaction ids are the server's, not a database's: the open transaction
// here is in another database of the server.
func TestLongTransactionHoldsBackDelivery(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := newTransport(t, db, url)
	pub := tr.Publisher()
	sub := subscriber(t, tr, "held")
	ch, err := sub.Subscribe(ctx, "held")
	require.NoError(t, err)
	receive := func(want string) time.Time {
		t.Helper()
		select {
		case msg := <-ch:
			require.Equal(t, want, msg.UUID)
			msg.Ack()
			return time.Now()
		case <-ctx.Done():
			t.Fatalf("%s was not delivered", want)
			return time.Time{}
		}
	}
	require.NoError(t, pub.Publish("held", message.NewMessage("before", []byte(`{}`))))
	receive("before")

	// Another database of the same server: a transaction that has an id
	// (it wrote, or asked for one) and stays open.
	other, err := sqlx.Open(postgres.DriverName, otherDatabase(t, url, "postgres"))
	require.NoError(t, err)
	defer other.Close()
	long, err := other.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer long.Rollback() // a no-op after the rollback below
	_, err = long.ExecContext(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	require.NoError(t, pub.Publish("held", message.NewMessage("during", []byte(`{}`))))
	select {
	case msg := <-ch:
		t.Fatalf("%s delivered while an older transaction is open", msg.UUID)
	case <-time.After(300 * time.Millisecond): // several polls
	}
	ended := time.Now()
	require.NoError(t, long.Rollback())
	t.Logf("delivered %s after the open transaction ended", receive("during").Sub(ended))
}

// otherDatabase returns url with its database replaced by name.
func otherDatabase(t *testing.T, url, name string) string {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestTransportUnreadableRows inserts rows by hand whose metadata is not a
// JSON object of strings: watermill-sql's default schema fails the query
// on each and the consumer group never moves past it. Each is delivered
// marked unreadable instead, keeping its stored metadata, and the row
// behind them follows.
func TestTransportUnreadableRows(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	sub := subscriber(t, newTransport(t, db, url), "c")
	topic := "unreadable." + watermill.NewShortUUID()
	require.NoError(t, sub.(message.SubscribeInitializer).SubscribeInitialize(topic))
	rows := []struct{ uuid, metadata, unreadable string }{
		{"number", `{"n":1}`, "metadata value is not a string"},
		{"array", `["a"]`, "metadata is not a JSON object"},
		{"nul", `{"k":"a\u0000b"}`, ""},
		{"fine", `{"content-type":"application/cloudevents+json"}`, ""},
	}
	for _, r := range rows {
		_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
			` (uuid, payload, metadata, transaction_id) VALUES ($1, '{"a":1}', $2, pg_current_xact_id())`, r.uuid, r.metadata)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	for _, r := range rows {
		select {
		case got := <-ch:
			require.Equal(t, r.uuid, got.UUID)
			require.Equal(t, r.unreadable, got.Metadata.Get(framework.MetadataUnreadable))
			if r.unreadable != "" {
				require.JSONEq(t, r.metadata, got.Metadata.Get(framework.MetadataUnreadableRaw))
				_, err := driver.DecodeMessage(got, 0)
				require.Equal(t, framework.CodeUnreadableMessage, framework.CodeOf(err))
			}
			got.Ack()
		case <-ctx.Done():
			t.Fatalf("row %s was not delivered: the subscription stalls", r.uuid)
		}
	}
}

// TestTransportOddCreatedAt inserts rows by hand whose created_at
// PostgreSQL cannot subtract from now() ('infinity', '-infinity') or
// that lie at the ends of its range: each is delivered, and the backlog
// is read, where the first read failed on every poll and held up the
// rows behind it.
func TestTransportOddCreatedAt(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	tr := newTransport(t, db, url)
	sub := subscriber(t, tr, "c")
	topic := "created." + watermill.NewShortUUID()
	require.NoError(t, sub.(message.SubscribeInitializer).SubscribeInitialize(topic))
	rows := []struct{ uuid, createdAt string }{
		{"infinity", "infinity"},
		{"minus-infinity", "-infinity"},
		{"first", "4713-01-01 00:00:00 BC"},
		{"last", "294276-12-31 23:59:59"},
		{"fine", "2026-12-07 10:00:00"},
	}
	for _, r := range rows {
		_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
			` (uuid, payload, metadata, transaction_id, created_at) VALUES ($1, '{"a":1}', '{}', pg_current_xact_id(), $2)`, r.uuid, r.createdAt)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	backlog, err := tr.Backlogs(ctx, "c", []string{topic}, 1)
	require.NoError(t, err, "the backlog reads the rows' ages")
	require.EqualValues(t, len(rows), backlog[0].Waiting)
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	for _, r := range rows {
		select {
		case got := <-ch:
			require.Equal(t, r.uuid, got.UUID)
			if r.uuid == "fine" {
				require.NotEmpty(t, got.Metadata.Get(framework.MetadataPublishedAt))
			}
			got.Ack()
		case <-ctx.Done():
			t.Fatalf("row %s was not delivered: the subscription stalls", r.uuid)
		}
	}
}

// TestTransportWithoutURL shows that a Transport without
// TransportConfig.URL publishes and replays but does not subscribe: it
// has no pool for subscribers.
func TestTransportWithoutURL(t *testing.T) {
	t.Parallel()
	tr, err := postgres.New(context.Background(), testenv.Postgres(t), fastTransport)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	_, err = tr.Subscribe(driver.SubscribeConfig{Consumer: "c", Types: []string{"a"}})
	require.ErrorContains(t, err, "TransportConfig.URL")
	_, err = postgres.New(context.Background(), nil, postgres.TransportConfig{})
	require.Error(t, err)
}
