package amqp

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

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
