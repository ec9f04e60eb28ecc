package middleware_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// TestDeadLetterRecordsSequenceAndDeliveries: the dead letter carries the
// event's subject sequence (a bulk replay orders a subject's dead letters
// by it) and the delivery count that the delivery guard reached, 1 for a
// first delivery it did not need to count; its history's failure carries
// the count too.
func TestDeadLetterRecordsSequenceAndDeliveries(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bd := setup(t, b, setupConfig{maxDeliveries: 5})
			bd.behave = func(context.Context, framework.Event[noteV1], int64) error {
				return framework.Permanent("note_rejected", nil)
			}
			deliver := func(id string, seq int64, redelivered string) driver.DeadLetter {
				t.Helper()
				env, err := noted.Envelope(noteV1{Text: "x"}, framework.Attributes{
					ID: id, Source: "notes", Subject: "note-" + id, SubjectSeq: seq,
				})
				require.NoError(t, err)
				msg := message.NewMessage(watermill.NewUUID(), body(t, env))
				if redelivered != "" {
					msg.Metadata.Set(framework.MetadataRedelivered, redelivered)
				}
				msg.SetContext(ctx)
				require.NoError(t, bd.handler(msg))
				dls, err := bd.store.DeadLetters(ctx, driver.DeadLetterFilter{EventID: id})
				require.NoError(t, err)
				require.Len(t, dls, 1)
				return dls[0]
			}

			first := deliver("1", 7, "false")
			require.EqualValues(t, 7, first.SubjectSeq)
			require.Equal(t, 1, first.Deliveries, "a first delivery the transport vouches for is the first, uncounted")

			again := deliver("2", 3, "true")
			require.EqualValues(t, 3, again.SubjectSeq)
			require.Equal(t, 2, again.Deliveries, "a redelivery counts the uncounted first delivery too")

			unknown := deliver("3", 0, "")
			require.Zero(t, unknown.SubjectSeq, "no subject sequence")
			require.Equal(t, 1, unknown.Deliveries, "a transport that cannot tell has every delivery counted")
			unknown = deliver("3", 0, "")
			require.Equal(t, 1, unknown.Deliveries, "the dead letter forgot the count: the next one starts afresh")

			h, err := bd.store.DeadLetterHistory(ctx, again.ID)
			require.NoError(t, err)
			require.Len(t, h, 1)
			require.Equal(t, driver.HistoryFailed, h[0].Kind)
			require.Equal(t, 2, h[0].Deliveries)
			require.Equal(t, framework.Code("note_rejected"), h[0].Code)
			require.Equal(t, 1, h[0].Attempts)
		})
	}
}

// TestDeadLetterCodeOfPermanentErrorLiteral: a handler's PermanentError
// built without Permanent, its code invalid or empty (one taken from the
// payload, say), is dead-lettered with handler_failed, as Permanent
// would have it: the code a dead letter stores and the operator's
// commands print is never text of the payload's.
func TestDeadLetterCodeOfPermanentErrorLiteral(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bd := setup(t, b, setupConfig{})
			bd.behave = func(_ context.Context, ev framework.Event[noteV1], _ int64) error {
				if ev.Data.Text == "empty" {
					return &framework.PermanentError{}
				}
				return &framework.PermanentError{Code: framework.Code("rejected: " + ev.Data.Text)}
			}
			for i, text := range []string{"\x1b[2Jsecret", "empty"} {
				env, err := noted.Envelope(noteV1{Text: text}, framework.Attributes{ID: fmt.Sprint("literal-", i), Source: "notes"})
				require.NoError(t, err)
				msg := message.NewMessage(watermill.NewUUID(), body(t, env))
				msg.SetContext(ctx)
				require.NoError(t, bd.handler(msg))
				dls, err := bd.store.DeadLetters(ctx, driver.DeadLetterFilter{EventID: env.ID})
				require.NoError(t, err)
				require.Len(t, dls, 1)
				require.Equal(t, framework.CodeHandlerFailed, dls[0].Code)
			}
		})
	}
}
