package amqp_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

type pinged struct {
	N int `json:"n"`
}

var ping = framework.Define[pinged]("tests.quorum.pinged", 1)

// TestQuorumDeliveryLimit: on a quorum queue whose x-delivery-limit is
// just above the consumer's max_deliveries, a message nacked on every
// delivery comes back more often than RabbitMQ 4's default limit (20)
// and ends as the framework's own dead letter, code delivery_limit: the
// broker did not drop it first. (With x-delivery-limit 24, below
// max_deliveries, RabbitMQ drops it after its 25th delivery, without a
// dead-letter exchange, and no dead letter is ever written.)
func TestQuorumDeliveryLimit(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	const maxDeliveries = 25 // above RabbitMQ 4's default x-delivery-limit, 20

	ctx := context.Background()
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	name := "tests.quorum-" + time.Now().Format("150405.000000")[7:]
	t.Cleanup(func() { deleteQueue(t, url, name) })
	consumer, err := framework.NewConsumer(name,
		framework.Handle(ping, func(context.Context, framework.Event[pinged]) error {
			return errors.New("fails every time")
		}),
	)
	require.NoError(t, err)

	tr, err := amqp.New(amqp.TransportConfig{
		URL: url, NackDelay: 5 * time.Millisecond, MaxNackDelay: 20 * time.Millisecond,
		QueueType: amqp.QueueQuorum, DeliveryLimit: maxDeliveries + 1,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, tr.Connect(connectCtx))
	// Each delivery past the delivery guard is nacked, as a message
	// that kills the process would come back, and counted.
	var deliveries atomic.Int32
	nack := func(message.HandlerFunc) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) {
			deliveries.Add(1)
			return nil, errors.New("not now")
		}
	}
	r, err := runner.New(runner.Config{
		Consumers: []runner.ConsumerConfig{{Consumer: consumer, Settings: middleware.Settings{Attempts: 1, MaxDeliveries: maxDeliveries, Concurrency: 1}}},
		Transport: tr,
		DB:        db,
		Store:     store,
		Outer:     []message.HandlerMiddleware{nack},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	env, err := ping.Envelope(pinged{N: 1}, framework.Attributes{ID: "ping-1", Source: "tests"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	require.NoError(t, tr.Publisher().Publish(ping.Type(), msg))

	var dls []driver.DeadLetter
	require.Eventually(t, func() bool {
		dls, err = store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: name})
		require.NoError(t, err)
		return len(dls) > 0
	}, 60*time.Second, 50*time.Millisecond, "the framework's dead letter")
	require.Len(t, dls, 1)
	require.Equal(t, framework.CodeDeliveryLimit, dls[0].Code)
	require.Equal(t, int32(maxDeliveries), deliveries.Load(), "nacked more often than RabbitMQ 4's default limit, then dead-lettered")
}

// deleteQueue deletes the queue from the broker at url.
func deleteQueue(t *testing.T, url, queue string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDelete(queue, false, false, false)
	}
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
	}
}
