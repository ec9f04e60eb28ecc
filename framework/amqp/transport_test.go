package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// newTransport returns a transport on cfg, connected.
func newTransport(t *testing.T, cfg TransportConfig) *Transport {
	t.Helper()
	tr, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, tr.Connect(ctx))
	return tr
}

// amqpEnv returns the conformance suite's Env on the broker at url, with
// a transport, and so a connection, of its own.
func amqpEnv(t *testing.T, url string, cfg TransportConfig) *transporttest.Env {
	t.Helper()
	cfg.URL = url
	return &transporttest.Env{
		Transport: newTransport(t, cfg),
		PublishRaw: func(t *testing.T, topic string, body []byte) {
			publishPlain(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Body: body})
		},
		PublishHeaders: func(t *testing.T, topic string, body []byte, headers map[string]any) {
			publishPlain(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Headers: table(headers), Body: body})
		},
	}
}

// table returns headers as an AMQP table: maps become tables, in arrays
// too.
func table(headers map[string]any) amqp091.Table {
	t := make(amqp091.Table, len(headers))
	for k, v := range headers {
		t[k] = fieldValue(v)
	}
	return t
}

func fieldValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return table(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fieldValue(e)
		}
		return out
	default:
		return v
	}
}

// publishPlain publishes p to exchange with a plain amqp091-go client and
// waits for the broker's confirm.
func publishPlain(t *testing.T, url, exchange string, p amqp091.Publishing) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false, p)
	require.NoError(t, err)
	ok, err := conf.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok, "broker confirms")
}

// TestTransport runs the transport conformance suite: what the AMQP
// transport does by itself, without the consumer chain.
func TestTransport(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
		return amqpEnv(t, url, TransportConfig{NackDelay: 20 * time.Millisecond})
	})
}
