package middleware_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/middleware"
)

// TestUnreachableDatabaseNeverDeadLetters: a message whose every attempt
// failed because its database could not be reached (a real connection
// refused, as during a restart) is nacked, to come again with all its
// attempts, and never dead-lettered as retries_exhausted; a failure of
// the handler's own stays a dead letter once its attempts ran out.
func TestUnreachableDatabaseNeverDeadLetters(t *testing.T) {
	t.Parallel()
	nowhere, err := sql.Open("pgx", "postgres://effectively:effectively@127.0.0.1:1/nowhere?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = nowhere.Close() })

	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			bd := setup(t, b, setupConfig{attempts: 3})
			bd.behave = func(ctx context.Context, _ framework.Event[noteV1], _ int64) error {
				_, err := nowhere.ExecContext(ctx, "SELECT 1")
				return err
			}
			msg := message.NewMessage(watermill.NewUUID(), event(t, "notes", "1"))
			msg.SetContext(context.Background())
			err := bd.handler(msg)
			require.Error(t, err, "the message is nacked")
			require.ErrorIs(t, err, pipeline.ErrLater, "delivered again later")
			require.Empty(t, bd.deadLetters(t), "an outage is no fault of the message")
			require.EqualValues(t, 3, bd.calls.Load(), "its attempts ran")
			r, ok := middleware.ReportOf(msg)
			require.True(t, ok)
			require.Equal(t, framework.Nacked, r.Outcome)

			// Once the database answers, the same message takes effect.
			bd.behave = nil
			require.NoError(t, bd.deliver(context.Background(), event(t, "notes", "1")), "the redelivery is handled")
			require.Equal(t, 1, bd.effects(t))
		})
	}
}
