package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/middleware"
)

// TestStopping: once Config.Stopping closes, the chain starts no further
// attempt: the attempt in flight ends, the message is nacked, not
// dead-lettered, after the attempts that ran, and a wait for the next
// attempt ends at once.
func TestStopping(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			exerciseStopping(t, b)
		})
	}
}

func exerciseStopping(t *testing.T, b backend) {
	// A retry delay that no test waits for: a message that ends before it
	// started no further attempt.
	const retryDelay = time.Hour
	outage := framework.Dependency(errors.New("database unreachable"))

	// handle delivers one event to bd's chain on a goroutine and returns
	// the message and its outcome; metadata, when not empty, is the
	// message's.
	handle := func(bd *bundle, metadata ...string) (*message.Message, <-chan error) {
		msg := message.NewMessage(watermill.NewUUID(), event(t, "notes", "1"))
		for i := 0; i+1 < len(metadata); i += 2 {
			msg.Metadata.Set(metadata[i], metadata[i+1])
		}
		msg.SetContext(context.Background())
		done := make(chan error, 1)
		go func() { done <- bd.handler(msg) }()
		return msg, done
	}
	// outcome waits for the chain's error, which stopping makes come long
	// before the retry delay.
	outcome := func(t *testing.T, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("the chain still waits for its next attempt after the stop")
			return nil
		}
	}
	// nackedAfter checks that msg was nacked, not dead-lettered, after
	// attempts attempts.
	nackedAfter := func(t *testing.T, bd *bundle, msg *message.Message, err error, attempts int) {
		t.Helper()
		require.Error(t, err, "the message is nacked")
		require.ErrorIs(t, err, pipeline.ErrLater, "delivered again later, as a wait is")
		require.ErrorIs(t, err, outage, "the error names the last attempt's failure")
		require.Empty(t, bd.deadLetters(t), "a stop never dead-letters")
		require.EqualValues(t, attempts, bd.calls.Load())
		r, ok := middleware.ReportOf(msg)
		require.True(t, ok)
		require.Equal(t, middleware.Report{Outcome: framework.Nacked, Attempts: attempts}, r)
		require.Zero(t, bd.effects(t))
		require.Zero(t, bd.marks(t))
		require.Zero(t, bd.count(t, `SELECT count FROM deliveries WHERE consumer = ?`, consumerName),
			"the delivery the stop ended is not charged")
	}

	// Counted: the delivery guard counted the delivery (a transport that
	// cannot tell redeliveries). FirstDelivery: the transport vouched for
	// a first delivery, which the guard did not count; its redelivery
	// will count as the first.
	for _, c := range []struct {
		name     string
		metadata []string
	}{
		{"Counted", nil},
		{"FirstDelivery", []string{framework.MetadataRedelivered, "false"}},
	} {
		t.Run("DuringRetryDelay"+c.name, func(t *testing.T) {
			t.Parallel()
			stopping := make(chan struct{})
			bd := setup(t, b, setupConfig{attempts: 5, retryDelay: retryDelay, stopping: stopping})
			failed := make(chan struct{})
			bd.behave = func(context.Context, framework.Event[noteV1], int64) error {
				close(failed) // a second attempt would panic
				return outage
			}
			msg, done := handle(bd, c.metadata...)
			<-failed
			close(stopping)
			nackedAfter(t, bd, msg, outcome(t, done), 1)
		})
	}

	t.Run("AttemptInFlightFinishes", func(t *testing.T) {
		t.Parallel()
		stopping := make(chan struct{})
		bd := setup(t, b, setupConfig{attempts: 5, retryDelay: retryDelay, stopping: stopping})
		running, release := make(chan struct{}), make(chan error)
		bd.behave = func(ctx context.Context, _ framework.Event[noteV1], call int64) error {
			close(running)
			return <-release
		}
		msg, done := handle(bd)
		<-running
		close(stopping)
		select {
		case err := <-done:
			t.Fatalf("the attempt in flight was cut short by the stop: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		release <- outage
		nackedAfter(t, bd, msg, outcome(t, done), 1)
	})

	t.Run("AttemptInFlightSucceeds", func(t *testing.T) {
		t.Parallel()
		stopping := make(chan struct{})
		bd := setup(t, b, setupConfig{attempts: 5, retryDelay: retryDelay, stopping: stopping})
		running, release := make(chan struct{}), make(chan error)
		bd.behave = func(ctx context.Context, _ framework.Event[noteV1], call int64) error {
			close(running)
			return <-release
		}
		_, done := handle(bd)
		<-running
		close(stopping)
		release <- nil
		require.NoError(t, outcome(t, done), "the attempt in flight takes effect")
		require.Equal(t, 1, bd.effects(t))
		require.Equal(t, 1, bd.marks(t))
	})

	t.Run("FirstAttemptRuns", func(t *testing.T) {
		t.Parallel()
		stopping := make(chan struct{})
		close(stopping)
		bd := setup(t, b, setupConfig{attempts: 5, retryDelay: retryDelay, stopping: stopping})
		bd.behave = func(context.Context, framework.Event[noteV1], int64) error { return outage }
		msg, done := handle(bd)
		nackedAfter(t, bd, msg, outcome(t, done), 1)

		ok := setup(t, b, setupConfig{attempts: 5, retryDelay: retryDelay, stopping: stopping})
		require.NoError(t, ok.deliver(context.Background(), event(t, "notes", "1")),
			"a message handled after the stop began still has its first attempt")
		require.Equal(t, 1, ok.effects(t))
	})
}
