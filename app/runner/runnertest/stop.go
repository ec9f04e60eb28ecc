package runnertest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
)

// caseStopDuringOutage: a dependency is down, so the attempts of an event
// fail; Stop, once the first attempt failed, starts no further attempt:
// it returns without waiting for the retries (five attempts, a long
// delay), the event is nacked, not dead-lettered, after the one attempt
// that ran, and a process started once the dependency is back handles it
// once. The stop does not charge the delivery: at max_deliveries 1 its
// redelivery would otherwise be dead-lettered as delivery_limit.
func caseStopDuringOutage(t *testing.T, s *suite) {
	const attempts, retryDelay = 5, 10 * time.Second
	var outage atomic.Bool
	outage.Store(true)
	failed := make(chan struct{}, attempts)
	s.setBehave(func(string, framework.Event[noteV1], int) error {
		if outage.Load() {
			failed <- struct{}{}
			return framework.Dependency(errTransient)
		}
		return nil
	})
	s.tune = func(cfg *runner.Config) {
		cc := &cfg.Consumers[0]
		cc.Attempts, cc.RetryDelay, cc.MaxDeliveries = attempts, retryDelay, 1
	}
	name := s.consumer("stop")
	p := s.start(t, name, 1, s.typ)
	ids := s.publishN(t, s.typ, 1, 0)
	select {
	case <-failed:
	case <-time.After(s.env.Timeout):
		t.Fatal("the first attempt did not run")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*retryDelay)
	defer cancel()
	start := time.Now()
	require.NoError(t, p.runner.Stop(ctx), "Stop waits for no retry")
	took := time.Since(start)
	p.stop()
	require.Less(t, took, (attempts-1)*retryDelay, "Stop waited for the retries")
	require.Empty(t, s.deadLetters(t, name), "a stop never dead-letters")
	require.Equal(t, 1, s.callsOf(name, "notes", ids[0]), "attempts that ran")
	require.Zero(t, s.effects(t, name))

	outage.Store(false)
	s.start(t, name, 1, s.typ)
	s.waitEffects(t, "stop", 1)
	settle()
	s.requireExactlyOnce(t, "stop", ids)
	require.Empty(t, s.deadLetters(t, name), "the delivery the stop ended was not charged")
	require.Equal(t, 2, s.callsOf(name, "notes", ids[0]))
}
