package middleware_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/middleware"
)

// randomSubject returns a subject of n bytes that does not compress, as
// PostgreSQL would compress a key before it measures it.
func randomSubject(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)[:n]
}

// subjectBody is an event of subject #seq as a producer writes it: the
// subject as it is, whatever its length (Encode refuses one over the
// limit).
func subjectBody(id, subject string, seq int64) []byte {
	return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"notes","type":%q,"eventversion":1,`+
		`"subject":%q,"subjectseq":"%d","data":{"text":"t"}}`, id, noted.Type(), subject, seq)
}

// TestSubjectLimit: a subject keys the checkpoints and parked events of
// strict order and skip stale. One at MaxSubjectBytes that does not
// compress is applied, held behind its dead letter and parked on every
// database; one over it is dead-lettered at once as too_large. On
// PostgreSQL, whose indexes refuse a key over about 2.7 kB, a longer
// subject failed every attempt and then its hold, so the message was
// nacked on every delivery, forever (under skip stale, dead-lettered as
// retries_exhausted).
func TestSubjectLimit(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, cfg := range []setupConfig{{strictOrder: true}, {skipStale: true}} {
				bd := setup(t, b, cfg)
				long := randomSubject(t, framework.MaxSubjectBytes)
				require.Equal(t, framework.Processed, bd.outcome(t, subjectBody("l1", long, 1)))

				bd.behave = func(_ context.Context, ev framework.Event[noteV1], _ int64) error {
					if ev.ID == "l2" {
						return framework.Permanent("refused", nil)
					}
					return nil
				}
				require.Equal(t, framework.DeadLettered, bd.outcome(t, subjectBody("l2", long, 2)))
				if cfg.strictOrder {
					require.Equal(t, framework.Parked, bd.outcome(t, subjectBody("l3", long, 3)), "parked behind the held l2")
				}

				r := bd.report(t, subjectBody("o1", randomSubject(t, 7*1024), 1))
				require.Equal(t, framework.DeadLettered, r.Outcome, "%+v", r)
				require.Equal(t, framework.CodeTooLarge, r.Code)
			}
		})
	}
}

// report hands payload to the chain and returns what the chain reported
// of it.
func (bd *bundle) report(t *testing.T, payload []byte) middleware.Report {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), payload)
	_ = bd.handler(msg) // a nack's error is in the report
	r, ok := middleware.ReportOf(msg)
	require.True(t, ok)
	return r
}

func (bd *bundle) outcome(t *testing.T, payload []byte) framework.Outcome {
	t.Helper()
	return bd.report(t, payload).Outcome
}
