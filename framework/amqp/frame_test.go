package amqp

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestReplayHeadersOverFrame: a message whose headers fit in a frame, a
// byte array of NULs, comes back from its dead letter with each NUL
// stored as U+FFFD, three times as long. Its replay does not fit in a
// frame: it fails with ErrHeadersTooLarge, and the connection, which
// RabbitMQ closed under every consumer on each of the relay's tries,
// stays up.
func TestReplayHeadersOverFrame(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	f := newFrameFixture(t, "r")
	conn, pub, consumer, ctx := f.conn, f.pub, f.consumer, t.Context()
	testenv.PublishAMQP(t, url, f.topic, amqp091.Publishing{
		Headers: amqp091.Table{"blob": []byte(strings.Repeat("\x00", 60_000))},
		Body:    []byte(`{"not":"an event"}`),
	})
	msg := receive(t, f.ch)
	msg.Ack()
	dl := driver.DeadLetter{ID: 7, Body: msg.Payload, Metadata: driver.StorableMetadata(msg.Metadata)}

	err := pub.Replay(ctx, consumer, dl.ReplayMessage())
	require.ErrorIs(t, err, ErrHeadersTooLarge)
	for range 10 {
		require.True(t, conn.Connected(), "the refused replay closed the connection")
		time.Sleep(30 * time.Millisecond)
	}
	require.NoError(t, pub.Replay(ctx, consumer, message.NewMessage("after", []byte(`{}`))))
	require.Equal(t, "after", receive(t, f.ch).UUID)
}

// TestFrameSize: headers that make the header frame exactly the
// negotiated frame size, its overhead included as AMQP 0-9-1 counts it,
// are published and confirmed; one byte more is refused before anything
// is sent, on Publish and on PublishDeferred, and the connection stays
// up. (RabbitMQ 3.10 takes 8 bytes more, a payload of the frame size,
// and closes the connection beyond.)
func TestFrameSize(t *testing.T) {
	t.Parallel()
	f := newFrameFixture(t, "s")
	conn, pub, topic := f.conn, f.pub, f.topic
	frameMax := conn.frameSize()
	require.Positive(t, frameMax)

	// sized returns a message whose header frame is frameMax+extra bytes.
	sized := func(extra int) *message.Message {
		msg := message.NewMessage("00000000-0000-0000-0000-000000000000", []byte(`{}`))
		msg.Metadata.Set("pad", "")
		p, err := Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		msg.Metadata.Set("pad", strings.Repeat("p", frameMax+extra-headerFrameSize(p)))
		return msg
	}
	require.NoError(t, pub.Publish(topic, sized(0)), "a header frame of exactly the frame size")
	require.True(t, conn.Connected())
	err := pub.Publish(topic, sized(1))
	require.True(t, errors.Is(err, ErrHeadersTooLarge), "one byte over: %v", err)
	_, err = pub.PublishDeferred(context.Background(), topic, sized(1))
	require.ErrorIs(t, err, ErrHeadersTooLarge)
	time.Sleep(100 * time.Millisecond)
	require.True(t, conn.Connected())
	wait, err := pub.PublishDeferred(context.Background(), topic, sized(0))
	require.NoError(t, err)
	require.NoError(t, wait(context.Background()))
}

// TestHeaderNameLength: a header's name is an AMQP short string, at most
// 255 bytes. One of 255 bytes arrives whole; one of 256, which amqp091-go
// would write with its length cut to a byte (0, here), is refused before
// anything is sent, and so is a replay whose stored name grew past 255
// (each NUL of a dead letter's name is U+FFFD, three bytes).
func TestHeaderNameLength(t *testing.T) {
	t.Parallel()
	f := newFrameFixture(t, "n")
	conn, pub, topic, consumer, ch, ctx := f.conn, f.pub, f.topic, f.consumer, f.ch, t.Context()

	longest := strings.Repeat("k", 255)
	msg := message.NewMessage("longest", []byte(`{}`))
	msg.Metadata.Set(longest, "v")
	require.NoError(t, pub.Publish(topic, msg))
	got := receive(t, ch)
	got.Ack()
	require.Equal(t, "v", got.Metadata.Get(longest))

	over := message.NewMessage("over", []byte(`{}`))
	over.Metadata.Set(longest+"k", "v")
	require.ErrorIs(t, pub.Publish(topic, over), ErrHeadersTooLarge)
	_, err := pub.PublishDeferred(ctx, topic, over)
	require.ErrorIs(t, err, ErrHeadersTooLarge)
	stored := message.NewMessage("stored", []byte(`{}`))
	stored.Metadata = driver.StorableMetadata(map[string]string{strings.Repeat("\x00", 86): "v"})
	err = pub.Replay(ctx, consumer, stored)
	require.ErrorIs(t, err, ErrHeadersTooLarge)
	require.True(t, framework.IsPermanent(err), "a replay that never fits is a failure of its message")
	require.True(t, conn.Connected())
}

// frameFixture is a publisher and a consumer subscribed to a topic of its
// own, on one connection, for the tests of what fits in a frame.
type frameFixture struct {
	conn            *connection
	pub             *publisher
	topic, consumer string
	ch              <-chan *message.Message
}

// newFrameFixture returns the fixture of the test named name; what it
// opened closes when the test ends.
func newFrameFixture(t *testing.T, name string) frameFixture {
	t.Helper()
	f := frameFixture{conn: connect(t, TransportConfig{}), topic: "frame." + name + randomSuffix(), consumer: "frame-" + name + randomSuffix()}
	var err error
	f.pub, err = newPublisher(f.conn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.pub.Close() })
	sub, err := subscriberOf(f.conn, f.consumer, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, sub.SubscribeInitialize(f.topic))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.ch, err = sub.Subscribe(ctx, f.topic)
	require.NoError(t, err)
	return f
}
