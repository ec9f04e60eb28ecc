package amqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/testenv"
)

// receive returns the next message of ch or fails after 15s.
func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-ch:
		return msg
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15s")
		return nil
	}
}

// TestMarshalerNonStringHeaders: watermill-amqp's DefaultMarshaler fails
// on the headers RabbitMQ and other clients add, which would nack the
// delivery before any middleware, forever; ours turns them into text.
func TestMarshalerNonStringHeaders(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	d := amqp091.Delivery{
		Headers: amqp091.Table{
			"x-delivery-count": int64(3),
			"x-death": []any{amqp091.Table{
				"count": int64(1), "reason": "rejected", "queue": "q", "time": when,
				"routing-keys": []any{"k"},
			}},
			"x-flag":  true,
			"x-ratio": 0.5,
			"x-bytes": []byte("raw"),
		},
		MessageId:   "mid-1",
		ContentType: "application/cloudevents+json",
		Redelivered: true,
		Body:        []byte(`{}`),
	}
	_, err := wamqp.DefaultMarshaler{}.Unmarshal(d)
	require.Error(t, err, "the trap: watermill-amqp's marshaler refuses non-string headers")

	msg, err := Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	require.Equal(t, "mid-1", msg.UUID, "the AMQP message-id stands in for watermill's UUID header")
	require.Equal(t, "3", msg.Metadata.Get("x-delivery-count"))
	require.Equal(t, "true", msg.Metadata.Get("x-flag"))
	require.Equal(t, "0.5", msg.Metadata.Get("x-ratio"))
	require.Equal(t, "raw", msg.Metadata.Get("x-bytes"))
	var death []map[string]any
	require.NoError(t, json.Unmarshal([]byte(msg.Metadata.Get("x-death")), &death))
	require.Equal(t, "rejected", death[0]["reason"])
	require.Equal(t, "2026-11-30T06:00:00Z", death[0]["time"])
	require.Equal(t, "application/cloudevents+json", msg.Metadata.Get(framework.MetadataContentType))
	require.Equal(t, "true", msg.Metadata.Get(framework.MetadataRedelivered))

	d.MessageId, d.Redelivered, d.Headers = "", false, nil
	msg, err = Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	require.NotEmpty(t, msg.UUID, "a generated UUID when the delivery has none")
	require.Equal(t, "false", msg.Metadata.Get(framework.MetadataRedelivered))

	// Publishing drops the markers of an earlier delivery.
	out := message.NewMessage("u-1", []byte(`{}`))
	out.Metadata.Set(framework.MetadataRedelivered, "true")
	out.Metadata.Set(wamqp.MetadataRedeliveredKey, "true")
	out.Metadata.Set("k", "v")
	p, err := Marshaler{}.Marshal(out)
	require.NoError(t, err)
	require.Equal(t, amqp091.Table{"k": "v", wamqp.DefaultMessageUUIDHeaderKey: "u-1"}, p.Headers)
	require.Equal(t, "u-1", p.MessageId)
	require.Equal(t, amqp091.Persistent, p.DeliveryMode)
}

// TestTrapHeadersFromTheBroker: a message with headers only a plain client
// or the broker sets is consumed end to end, not nacked in a loop.
func TestTrapHeadersFromTheBroker(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	conn := connect(t, TransportConfig{})
	topic, consumer := "traps.h"+randomSuffix(), "traps-h"+randomSuffix()
	sub, err := subscriberOf(conn, consumer, 1)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, sub.SubscribeInitialize(topic))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	testenv.PublishAMQP(t, url, topic, amqp091.Publishing{
		Headers:   amqp091.Table{"x-delivery-count": int32(2), "x-death": []any{amqp091.Table{"count": int64(1)}}},
		MessageId: "plain-1",
		Body:      []byte(`{"plain":true}`),
	})
	msg := receive(t, ch)
	require.Equal(t, "plain-1", msg.UUID)
	require.Equal(t, "2", msg.Metadata.Get("x-delivery-count"))
	require.Equal(t, "false", msg.Metadata.Get(framework.MetadataRedelivered))
	msg.Ack()
}

// TestTrapNackBacksOff: watermill-amqp requeues a nacked message at once,
// a hot loop; the Subscriber pauses first, doubling the pause per
// consecutive nack. The redelivered flag reaches the framework.
func TestTrapNackBacksOff(t *testing.T) {
	t.Parallel()
	conn := connect(t, TransportConfig{NackDelay: 100 * time.Millisecond, MaxNackDelay: 400 * time.Millisecond})
	topic, consumer := "traps.n"+randomSuffix(), "traps-n"+randomSuffix()
	sub, err := subscriberOf(conn, consumer, 1)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, sub.SubscribeInitialize(topic))
	pub, err := newPublisher(conn)
	require.NoError(t, err)
	defer pub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic, message.NewMessage("n-1", []byte(`{}`))))

	start := time.Now()
	var flags []string
	for time.Since(start) < 1500*time.Millisecond {
		msg := receive(t, ch)
		flags = append(flags, msg.Metadata.Get(framework.MetadataRedelivered))
		msg.Nack()
	}
	// Pauses of 100, 200, 400, 400 ms: about five deliveries in 1.5s, where
	// an immediate requeue makes thousands.
	require.GreaterOrEqual(t, len(flags), 3)
	require.LessOrEqual(t, len(flags), 7, "deliveries in 1.5s")
	require.Equal(t, "false", flags[0])
	for _, f := range flags[1:] {
		require.Equal(t, "true", f)
	}
	msg := receive(t, ch)
	msg.Ack()
}

// TestTrapFanoutDropsUnbound: a fanout exchange drops what is published
// before a queue is bound to it, which is why the application binds every
// consumer's queue in its start hook, before anything publishes.
func TestTrapFanoutDropsUnbound(t *testing.T) {
	t.Parallel()
	conn := connect(t, TransportConfig{})
	topic, consumer := "traps.f"+randomSuffix(), "traps-f"+randomSuffix()
	pub, err := newPublisher(conn)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("lost", []byte(`{}`))), "confirmed, yet routed nowhere")

	sub, err := subscriberOf(conn, consumer, 1)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, sub.SubscribeInitialize(topic))
	require.NoError(t, pub.Publish(topic, message.NewMessage("kept", []byte(`{}`))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receive(t, ch)
	require.Equal(t, "kept", msg.UUID)
	msg.Ack()
	select {
	case m := <-ch:
		t.Fatalf("unexpected message %s", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestReplayToOneQueue: a replay reaches the named consumer's queue only,
// and a replay to a queue that does not exist fails rather than vanish.
func TestReplayToOneQueue(t *testing.T) {
	t.Parallel()
	conn := connect(t, TransportConfig{})
	topic := "traps.r" + randomSuffix()
	a, b := "traps-ra"+randomSuffix(), "traps-rb"+randomSuffix()
	pub, err := newPublisher(conn)
	require.NoError(t, err)
	defer pub.Close()
	subA, err := subscriberOf(conn, a, 1)
	require.NoError(t, err)
	defer subA.Close()
	subB, err := subscriberOf(conn, b, 1)
	require.NoError(t, err)
	defer subB.Close()
	require.NoError(t, subA.SubscribeInitialize(topic))
	require.NoError(t, subB.SubscribeInitialize(topic))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, pub.Replay(ctx, a, message.NewMessage("again", []byte(`{}`))))
	require.Error(t, pub.Replay(ctx, "traps-missing"+randomSuffix(), message.NewMessage("x", nil)))
	chA, err := subA.Subscribe(ctx, topic)
	require.NoError(t, err)
	chB, err := subB.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receive(t, chA)
	require.Equal(t, "again", msg.UUID)
	msg.Ack()
	select {
	case m := <-chB:
		t.Fatalf("the other consumer got %s", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := newConnection(TransportConfig{})
	require.ErrorIs(t, err, ErrMissingURL)
	_, err = newConnection(TransportConfig{URL: "http://x"})
	require.ErrorContains(t, err, "amqp://")
	_, err = newConnection(TransportConfig{URL: "amqp://u:secret@h/", Prefetch: -1})
	require.ErrorContains(t, err, "Prefetch")
	require.Equal(t, "amqp://u:xxxxx@h/", redact("amqp://u:secret@h/"))
	conn, err := newConnection(TransportConfig{URL: "amqp://h/"})
	require.NoError(t, err)
	sub, err := subscriberOf(conn, "c", 1)
	require.NoError(t, err)
	require.ErrorIs(t, sub.SubscribeInitialize("t"), ErrNotConnected)
	require.NoError(t, sub.Close())
	require.NoError(t, conn.Close())
}

func randomSuffix() string { return time.Now().Format("150405.000000000")[7:] + randomHex() }

// randomHex returns six random hex digits, for names of a test's own.
func randomHex() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
