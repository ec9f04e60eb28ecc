package pipeline_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/pipeline"
)

func TestAckOrNack(t *testing.T) {
	t.Parallel()
	failed := errors.New("handler failed")
	acked := func(msg *message.Message) bool {
		select {
		case <-msg.Acked():
			return true
		default:
			return false
		}
	}

	t.Run("AcksOnSuccess", func(t *testing.T) {
		msg := message.NewMessage("1", nil)
		require.True(t, pipeline.AckOrNack(msg, nil))
		require.True(t, acked(msg))
	})
	t.Run("NacksOnError", func(t *testing.T) {
		msg := message.NewMessage("1", nil)
		require.False(t, pipeline.AckOrNack(msg, failed))
		require.False(t, acked(msg))
	})
	t.Run("ReportsWhatTheChainDid", func(t *testing.T) {
		msg := message.NewMessage("1", nil)
		msg.Ack() // a step acked it, then the handler returned an error
		require.True(t, pipeline.AckOrNack(msg, failed))

		msg = message.NewMessage("1", nil)
		msg.Nack() // a step nacked it, then the handler returned nil
		require.False(t, pipeline.AckOrNack(msg, nil))
		require.False(t, acked(msg))
	})
}
