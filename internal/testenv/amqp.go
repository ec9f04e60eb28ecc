package testenv

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// PublishAMQP publishes p to exchange as a plain amqp091-go client would,
// without watermill, and waits for the broker's confirm.
func PublishAMQP(t testing.TB, url, exchange string, p amqp091.Publishing) {
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

// AMQPTable returns headers as an AMQP table: maps become tables, in
// arrays too.
func AMQPTable(headers map[string]any) amqp091.Table {
	t := make(amqp091.Table, len(headers))
	for k, v := range headers {
		t[k] = amqpField(v)
	}
	return t
}

func amqpField(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return AMQPTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = amqpField(e)
		}
		return out
	default:
		return v
	}
}
