package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
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
		Transport:      newTransport(t, cfg),
		SettleReported: true,
		PublishRaw: func(t *testing.T, topic string, body []byte) {
			testenv.PublishAMQP(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Body: body})
		},
		PublishHeaders: func(t *testing.T, topic string, body []byte, headers map[string]any) {
			testenv.PublishAMQP(t, url, topic, amqp091.Publishing{ContentType: "application/cloudevents+json", Headers: testenv.AMQPTable(headers), Body: body})
		},
	}
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
