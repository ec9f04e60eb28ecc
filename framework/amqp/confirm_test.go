package amqp

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestPublishDeferred: messages published without waiting for their
// confirms are confirmed one by one, on a channel opened again when the
// last one closed; before Connect and after Close it fails at once.
func TestPublishDeferred(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Require(t, testenv.AMQPURLVar)

	unconnected, err := New(TransportConfig{URL: url})
	require.NoError(t, err)
	_, err = unconnected.pub.PublishDeferred(ctx, "t", message.NewMessage("1", nil))
	require.ErrorIs(t, err, ErrNotConnected)
	require.NoError(t, unconnected.Close())

	tr := newTransport(t, TransportConfig{URL: url})
	topic := "amqp.test.deferred." + randomSuffix()
	t.Cleanup(func() {
		if w, err := tr.conn.wrapper(); err == nil {
			if ch, err := w.Connection().Channel(); err == nil {
				_ = ch.ExchangeDelete(topic, false, false)
				_ = ch.Close()
			}
		}
	})
	bindQueue(t, tr, topic) // else every message is unroutable
	var waits []func(context.Context) error
	for i := range 50 {
		if i == 25 { // the channel closes under the publisher: the next publish opens another
			tr.pub.confirms.mu.Lock()
			require.NoError(t, tr.pub.confirms.ch.Close())
			tr.pub.confirms.mu.Unlock()
			for _, wait := range waits {
				_ = wait(ctx) // confirmed, or not when the close came first
			}
			waits = nil
		}
		wait, err := tr.pub.PublishDeferred(ctx, topic, message.NewMessage(randomHex(), []byte("{}")))
		require.NoError(t, err)
		waits = append(waits, wait)
	}
	for _, wait := range waits {
		require.NoError(t, wait(ctx))
	}

	require.NoError(t, tr.pub.Close())
	_, err = tr.pub.PublishDeferred(ctx, topic, message.NewMessage("1", nil))
	require.ErrorIs(t, err, ErrClosed)
}

// TestPublishDeferredUnroutable: a message to an exchange with no queue
// bound is returned by the broker, and its wait says so
// (driver.ErrUnroutable), while the messages confirmed around it, to a
// bound exchange, on the same channel, wait for nothing more. Half the
// messages have a UUID of 256 bytes, as an event's id may be, which no
// AMQP message-id holds: they are published, and returned, alike.
func TestPublishDeferredUnroutable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Require(t, testenv.AMQPURLVar)
	tr := newTransport(t, TransportConfig{URL: url})
	bound, unbound := "amqp.test.bound."+randomSuffix(), "amqp.test.unbound."+randomSuffix()
	bindQueue(t, tr, bound)
	t.Cleanup(func() {
		if w, err := tr.conn.wrapper(); err == nil {
			if ch, err := w.Connection().Channel(); err == nil {
				_ = ch.ExchangeDelete(unbound, false, false)
				_ = ch.Close()
			}
		}
	})
	type sent struct {
		routed bool
		wait   func(context.Context) error
	}
	var all []sent
	for i := range 60 {
		topic, routed := bound, i%3 != 1
		if !routed {
			topic = unbound
		}
		id := randomHex()
		if i%2 == 0 { // an event's id of 256 bytes, one more than a message-id holds
			id += strings.Repeat("x", framework.MaxIDBytes-len(id))
		}
		wait, err := tr.pub.PublishDeferred(ctx, topic, message.NewMessage(id, []byte("{}")))
		require.NoError(t, err)
		all = append(all, sent{routed, wait})
	}
	for i, s := range all {
		err := s.wait(ctx)
		if s.routed {
			require.NoError(t, err, "message %d", i)
		} else {
			require.ErrorIs(t, err, driver.ErrUnroutable, "message %d", i)
		}
	}
}

// bindQueue declares the exchange of topic and binds to it a queue, both
// deleted at the end.
func bindQueue(t *testing.T, tr *Transport, topic string) {
	t.Helper()
	w, err := tr.conn.wrapper()
	require.NoError(t, err)
	ch, err := w.Connection().Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "", topic, false, nil))
	t.Cleanup(func() {
		if ch, err := w.Connection().Channel(); err == nil {
			_, _ = ch.QueueDelete(q.Name, false, false, false)
			_ = ch.ExchangeDelete(topic, false, false)
			_ = ch.Close()
		}
	})
}
