package middleware_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

// TestStrictOrderParksBehindUndecodable: under strict order, an event
// whose envelope decodes but whose version the consumer does not handle
// is a dead letter of its subject like any other: the later events of
// its subject are parked behind it, not left waiting until sequence_gap.
func TestStrictOrderParksBehindUndecodable(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			o := newOrdered(t, b)
			h := o.handler(t, o.store)
			require.Equal(t, framework.Processed, deliver(t, h, "u1", "U", 1))

			v2 := framework.Define[noteV1](noted.Type(), 2) // a version this consumer does not handle
			env, err := v2.Envelope(noteV1{Text: "u2"}, framework.Attributes{ID: "u2", Source: "notes", Subject: "U", SubjectSeq: 2})
			require.NoError(t, err)
			msg := message.NewMessage(watermill.NewUUID(), body(t, env))
			require.NoError(t, h(msg))
			r, ok := middleware.ReportOf(msg)
			require.True(t, ok)
			require.Equal(t, framework.DeadLettered, r.Outcome)
			require.Equal(t, framework.CodeUnsupportedVersion, r.Code)

			require.Equal(t, framework.Parked, deliver(t, h, "u3", "U", 3), "parked behind the undecodable dead letter")
			require.Equal(t, []string{"u2 held", "u3"}, o.parked(t))

			dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			seq, err := o.store.Skip(context.Background(), consumerName, "U", dls[0].Key())
			require.NoError(t, err, "a discard with --release-parked skips it")
			require.EqualValues(t, 2, seq)
		})
	}
}
