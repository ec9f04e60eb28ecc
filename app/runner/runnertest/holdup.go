package runnertest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
)

// The hold-up cases' consumer: few attempts and a low delivery limit, so that
// a bad message at the head of a consumer's line reaches its dead letter
// quickly. One message in flight: whatever is behind it waits for it.
const (
	holdUpAttempts      = 3
	holdUpMaxDeliveries = 3
	holdUpValid         = 10
	holdUpBad           = "bad"
)

// hangTimeout is the attempt timeout of the dying case: longer than any
// wait of the suite, so that the attempt hangs until its process stops.
const hangTimeout = time.Hour

func tuneHoldUp(cfg *runner.Config) {
	cc := &cfg.Consumers[0]
	cc.MaxDeliveries = holdUpMaxDeliveries
	cc.Attempts = holdUpAttempts
	cc.RetryDelay = time.Millisecond
}

// publishBadThenValid publishes the bad event, then holdUpValid valid
// ones behind it, and returns the valid ones' ids. They go in one
// Publish, one transaction on the SQL transports: on SQLite the bad
// event's attempt, which hangs inside its transaction in the dying case,
// holds the file's write lock, so a publish that came after it began
// would wait for the lock until the busy timeout (a race the suite lost
// once in a clean-clone run).
func (s *suite) publishBadThenValid(t *testing.T) []string {
	t.Helper()
	msgs := []*message.Message{s.message(t, s.typ, "notes", holdUpBad, "hello")}
	ids := make([]string, holdUpValid)
	for i := range ids {
		ids[i] = fmt.Sprintf("ev-%d", i)
		msgs = append(msgs, s.message(t, s.typ, "notes", ids[i], "hello"))
	}
	s.publish(t, s.typ, msgs...)
	return ids
}

// requireBadDeadLettered checks the end of a hold-up case: the bad event
// is the consumer's one dead letter, with code, and took no effect; every
// valid event behind it took effect exactly once.
func (s *suite) requireBadDeadLettered(t *testing.T, role string, code framework.Code, valid []string) {
	t.Helper()
	name := s.consumer(role)
	s.waitEffects(t, role, len(valid))
	settle()
	s.requireExactlyOnce(t, role, valid)
	dls := s.deadLetters(t, name)
	require.Len(t, dls, 1, "the bad event is the one dead letter")
	require.Equal(t, holdUpBad, dls[0].EventID)
	require.Equal(t, code, dls[0].Code)
	require.Zero(t, dls[0].Repeats, "the dead letter is acknowledged, not delivered again")
}

// caseHoldUpFailing: the handler fails on one event on every attempt,
// with events behind it on a consumer that handles one message at a time.
// The bad event is dead-lettered once its attempts ran out, on its first
// delivery (retries_exhausted), and every event behind it takes effect
// exactly once: a failing message holds the line back for one attempt
// budget, attempts × (timeout + delay), not forever.
func caseHoldUpFailing(t *testing.T, s *suite) {
	s.tune = tuneHoldUp
	s.setBehave(func(_ string, ev framework.Event[noteV1], _ int) error {
		if ev.ID == holdUpBad {
			return errTransient
		}
		return nil
	})
	name := s.consumer("holdup-fail")
	s.start(t, name, 1, s.typ)
	valid := s.publishBadThenValid(t)
	s.waitFor(t, "the dead letter of the bad event", func() bool { return len(s.deadLetters(t, name)) == 1 })
	s.requireBadDeadLettered(t, "holdup-fail", framework.CodeRetriesExhausted, valid)
	require.Equal(t, holdUpAttempts, s.callsOf(name, "notes", holdUpBad), "one delivery: its attempts, no more")
	require.Equal(t, holdUpAttempts, s.deadLetters(t, name)[0].Attempts)
}

// caseHoldUpDying: the process dies on one event on every delivery: the
// attempt hangs inside its transaction until the process is stopped, and
// another process takes over, again and again. The durable delivery count
// dead-letters the event once it was delivered MaxDeliveries times
// (delivery_limit), and every event behind it takes effect exactly once: a
// message that kills its consumer holds the line back for at most
// MaxDeliveries deliveries.
func caseHoldUpDying(t *testing.T, s *suite) {
	var died atomic.Int32
	s.tune = func(cfg *runner.Config) {
		tuneHoldUp(cfg)
		cfg.Consumers[0].Timeout = hangTimeout // the attempt hangs until the process stops
		cfg.Inner = append(cfg.Inner, dieOn(holdUpBad, &died))
	}
	role := "holdup-die"
	name := s.consumer(role)
	p := s.start(t, name, 1, s.typ)
	valid := s.publishBadThenValid(t)
	for n := int32(1); ; n++ {
		s.waitFor(t, fmt.Sprintf("delivery %d of the bad event, or its dead letter", n), func() bool {
			return died.Load() >= n || len(s.deadLetters(t, name)) == 1
		})
		if died.Load() < n {
			break // dead-lettered
		}
		require.LessOrEqual(t, n, int32(holdUpMaxDeliveries), "delivered past the delivery limit")
		p.stop() // the process dies on the bad event: its attempt rolls back
		p = s.start(t, name, 1, s.typ)
	}
	s.requireBadDeadLettered(t, role, framework.CodeDeliveryLimit, valid)
	require.Equal(t, int32(holdUpMaxDeliveries), died.Load(), "deliveries of the bad event that reached the handler")
}

// dieOn hangs every attempt at the event with id inside its transaction
// until the message context ends (the process stops), counting the
// attempts in died.
func dieOn(id string, died *atomic.Int32) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, ok := framework.EnvelopeFromContext(msg.Context())
			if !ok || d.Key().ID != id {
				return next(msg)
			}
			died.Add(1)
			<-msg.Context().Done()
			return nil, fmt.Errorf("process died on %s: %w", id, msg.Context().Err())
		}
	}
}
