package pipeline_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// settler records what Settle told it.
type settler struct{ got []bool }

func (s *settler) Settled(acked bool) { s.got = append(s.got, acked) }

func TestSettle(t *testing.T) {
	t.Parallel()
	failed := errors.New("handler failed")
	withSettler := func() (*message.Message, *settler) {
		s := &settler{}
		msg := message.NewMessage("1", nil)
		msg.SetContext(pipeline.With[pipeline.Settler](context.Background(), s))
		return msg, s
	}
	acked := func(msg *message.Message) bool {
		select {
		case <-msg.Acked():
			return true
		default:
			return false
		}
	}

	t.Run("AcksOnSuccess", func(t *testing.T) {
		msg, s := withSettler()
		pipeline.Settle(msg, nil)
		require.True(t, acked(msg))
		require.Equal(t, []bool{true}, s.got)
	})
	t.Run("NacksOnError", func(t *testing.T) {
		msg, s := withSettler()
		pipeline.Settle(msg, failed)
		require.False(t, acked(msg))
		require.Equal(t, []bool{false}, s.got)
	})
	t.Run("ReportsWhatTheChainDid", func(t *testing.T) {
		msg, s := withSettler()
		msg.Ack() // a step acked it, then the handler returned an error
		pipeline.Settle(msg, failed)
		require.Equal(t, []bool{true}, s.got)

		msg, s = withSettler()
		msg.Nack() // a step nacked it, then the handler returned nil
		pipeline.Settle(msg, nil)
		require.False(t, acked(msg))
		require.Equal(t, []bool{false}, s.got)
	})
	t.Run("LeavesAMessageWithoutSettler", func(t *testing.T) {
		msg := message.NewMessage("1", nil)
		pipeline.Settle(msg, nil)
		require.False(t, acked(msg), "the router acks it, and its transport watches")
	})
}

func TestReported(t *testing.T) {
	t.Parallel()
	require.False(t, pipeline.Reported(context.Background()))
	require.True(t, pipeline.Reported(pipeline.With(context.Background(), pipeline.SettleReported(true))))
}
