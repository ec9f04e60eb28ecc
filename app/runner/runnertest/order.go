package runnertest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
)

// caseOrderHotKeys: a strict_order consumer drains a few subjects of many
// events each, published in sequence, subjects interleaved: each event's
// handler finds its predecessor's effect, and no event waits by
// redelivery (no nack, no parked event, no dead letter).
func caseOrderHotKeys(t *testing.T, s *suite) {
	s.exerciseOrder(t, 8, 25)
}

// caseOrderColdKeys: as caseOrderHotKeys, with many subjects of few events.
func caseOrderColdKeys(t *testing.T, s *suite) {
	s.exerciseOrder(t, 100, 2)
}

// exerciseOrder publishes perSubject events of each of subjects subjects
// (round robin, each subject's in sequence) to a strict_order consumer of
// concurrency 16 and checks the order of their effects.
func (s *suite) exerciseOrder(t *testing.T, subjects, perSubject int) {
	if s.env.Unordered != "" {
		t.Skip(s.env.Unordered)
	}
	ctx := context.Background()
	_, err := s.env.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS order_effects (consumer TEXT NOT NULL, subject TEXT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (consumer, subject, seq))`)
	require.NoError(t, err)
	role := "ordered"
	name := s.consumer(role)
	var (
		mu         sync.Mutex
		violations []string
		nacks      int
	)
	s.inOrder = func(ctx context.Context, ev framework.Event[noteV1]) error {
		conn := framework.Conn(ctx, s.env.DB)
		var last int64
		if err := conn.QueryRowxContext(ctx, s.env.DB.Rebind(`SELECT COALESCE(MAX(seq), 0) FROM order_effects WHERE consumer = ? AND subject = ?`), name, ev.Subject).Scan(&last); err != nil {
			return fmt.Errorf("read the subject's last effect: %w", err)
		}
		if last != ev.SubjectSeq-1 {
			mu.Lock()
			violations = append(violations, fmt.Sprintf("%s #%d ran after #%d", ev.Subject, ev.SubjectSeq, last))
			mu.Unlock()
		}
		_, err := conn.ExecContext(ctx, s.env.DB.Rebind(`INSERT INTO order_effects (consumer, subject, seq) VALUES (?, ?, ?)`), name, ev.Subject, ev.SubjectSeq)
		return err
	}
	s.tune = func(cfg *runner.Config) {
		cfg.Consumers[0].StrictOrder = true
		cfg.Consumers[0].MaxDeliveries = 3 // a wait by redelivery would show
	}
	s.around = append(s.around, func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err != nil {
				mu.Lock()
				nacks++
				mu.Unlock()
			}
			return out, err
		}
	})
	s.start(t, name, 16, s.typ)

	msgs := make([]*message.Message, 0, subjects*perSubject)
	for seq := 1; seq <= perSubject; seq++ {
		for subject := range subjects {
			env, err := s.typ.Envelope(noteV1{Text: "step"}, framework.Attributes{
				ID: fmt.Sprintf("s%d-%d", subject, seq), Source: "orders",
				Subject: fmt.Sprintf("order-%d", subject), SubjectSeq: int64(seq),
			})
			require.NoError(t, err)
			msg, err := framework.NewMessage(env)
			require.NoError(t, err)
			msgs = append(msgs, msg)
		}
	}
	for start := 0; start < len(msgs); start += 50 {
		s.publish(t, s.typ, msgs[start:min(start+50, len(msgs))]...)
	}
	n := subjects * perSubject
	s.waitFor(t, fmt.Sprintf("%d ordered effects", n), func() bool {
		return s.count(t, `SELECT count(*) FROM order_effects WHERE consumer = ?`, name) >= n
	})
	require.Equal(t, n, s.count(t, `SELECT count(*) FROM order_effects WHERE consumer = ?`, name), "effects")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, violations, "events that ran before their predecessor took effect")
	require.Zero(t, nacks, "events nacked: waited by redelivery")
	require.Zero(t, s.count(t, `SELECT count(*) FROM parked_events WHERE consumer = ?`, name), "parked events")
	require.Empty(t, s.deadLetters(t, name), "dead letters")
}
