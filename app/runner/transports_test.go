package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner/runnertest"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMemory runs the chain suite on the memory transport, GoChannel,
// whose every subscription gets every message: duplicates galore, which
// the dedup absorbs. The stores are in SQLite.
func TestMemory(t *testing.T) {
	t.Parallel()
	runnertest.Exercise(t, runnertest.Has{}, func(t *testing.T) *runnertest.Env {
		db := testenv.SQLite(t)
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		tr, err := memory.New(memory.TransportConfig{NackDelay: 20 * time.Millisecond})
		require.NoError(t, err)
		return &runnertest.Env{
			DB:    db,
			Store: store,
			Env: transporttest.Env{
				Transport: tr,
				// What a producer without watermill sends: a body, no metadata.
				PublishRaw: func(t *testing.T, topic string, body []byte) {
					require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(watermill.NewUUID(), body)))
				},
			},
		}
	})
}

// TestSQLite runs the chain suite on the SQLite transport sharing the
// stores' file, as the default configuration does. A plain client inserts
// rows into its messages table by hand.
func TestSQLite(t *testing.T) {
	t.Parallel()
	runnertest.Exercise(t, runnertest.Has{Order: true, Backlogs: true}, func(t *testing.T) *runnertest.Env {
		db, err := sqlite.Open(context.Background(), testenv.SQLitePath(t), sqlite.OpenConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		tr, err := sqlite.New(db, sqlite.TransportConfig{Subscriber: sqlite.SubscriberConfig{
			PollInterval: 20 * time.Millisecond,
			NackDelay:    20 * time.Millisecond,
		}})
		require.NoError(t, err)
		return &runnertest.Env{
			DB:    db,
			Store: store,
			Env: transporttest.Env{
				Transport: tr,
				PublishRaw: func(t *testing.T, topic string, body []byte) {
					_, err := db.Exec(`INSERT INTO pubsub_messages (topic, payload) VALUES (?, ?)`, topic, body)
					require.NoError(t, err)
				},
				PublishRow: func(_ *testing.T, topic string, body []byte, metadata string) error {
					_, err := db.Exec(`INSERT INTO pubsub_messages (topic, payload, metadata) VALUES (?, ?, ?)`, topic, body, metadata)
					return err
				},
			},
		}
	})
}

// TestPostgres runs the chain suite on the PostgreSQL (SQL) transport,
// each case in a schema of its own: the stores and the publisher share one
// pool; each process has a transport of its own, whose subscribers have a
// pool of their own.
func TestPostgres(t *testing.T) {
	t.Parallel()
	runnertest.Exercise(t, runnertest.Has{Order: true, Partitions: true, Redeliveries: true, Holds: true, Backlogs: true}, func(t *testing.T) *runnertest.Env {
		url := testenv.PostgresURL(t)
		db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 20})
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		store, err := postgres.NewStore(db, postgres.StoreConfig{})
		require.NoError(t, err)
		cfg := postgres.TransportConfig{URL: url, PollInterval: 20 * time.Millisecond, ResendInterval: 50 * time.Millisecond}
		newTransport := func(t *testing.T) driver.Transport {
			tr, err := postgres.New(context.Background(), db, cfg)
			require.NoError(t, err)
			return tr
		}
		insert := func(topic string, body []byte, metadata string) error {
			// The documented format of a message inserted by hand.
			_, err := db.Exec(`INSERT INTO `+postgres.MessagesTable("", topic)+
				` (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())`,
				"hand-"+watermill.NewShortUUID(), string(body), metadata)
			return err
		}
		return &runnertest.Env{
			DB:      db,
			Store:   store,
			Process: newTransport,
			Env: transporttest.Env{
				Transport: newTransport(t),
				PublishRaw: func(t *testing.T, topic string, body []byte) {
					require.NoError(t, insert(topic, body, "{}"))
				},
				PublishRow: func(_ *testing.T, topic string, body []byte, metadata string) error {
					return insert(topic, body, metadata)
				},
				StoresJSON: true,
			},
		}
	})
}

// TestAMQP runs the chain suite on RabbitMQ, with the stores in a
// PostgreSQL schema of the test's own. Each process has a transport, and
// so a connection, of its own.
func TestAMQP(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	runnertest.Exercise(t, runnertest.Has{Order: true, Partitions: true, Redeliveries: true, Holds: true, Backlogs: true}, func(t *testing.T) *runnertest.Env {
		db := testenv.Postgres(t)
		store, err := postgres.NewStore(db, postgres.StoreConfig{})
		require.NoError(t, err)
		cfg := amqp.TransportConfig{URL: url, NackDelay: 20 * time.Millisecond}
		newTransport := func(t *testing.T) driver.Transport {
			tr, err := amqp.New(cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := tr.Connect(ctx); err != nil {
				_ = tr.Close()
				t.Fatalf("connect to %s: %v", url, err)
			}
			return tr
		}
		return &runnertest.Env{
			DB:      db,
			Store:   store,
			Process: newTransport,
			Env: transporttest.Env{
				Transport: newTransport(t),
				PublishRaw: func(t *testing.T, topic string, body []byte) {
					testenv.PublishAMQP(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Body: body})
				},
				PublishHeaders: func(t *testing.T, topic string, body []byte, headers map[string]any) {
					testenv.PublishAMQP(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Headers: testenv.AMQPTable(headers), Body: body})
				},
			},
		}
	})
}
