package runnertest

import (
	"context"
	"fmt"
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

// caseStopHandsBack: while a stopping process drains its attempt in
// flight, the messages that reach it are handed back unhandled: refused
// at its closed intake, or still held by the transport for it (a
// prefetch), which hands them out at the end of the subscription. None
// of them is charged: at max_deliveries 1, the process started next
// handles each once, though the transport flags it redelivered, and none
// is dead-lettered as delivery_limit. It runs unpartitioned, then with
// two partitions (a partitioned consumer's subscription on PostgreSQL
// tells redeliveries).
func caseStopHandsBack(t *testing.T, s *suite) {
	const n = 30
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s.setBehave(func(_ string, ev framework.Event[noteV1], _ int) error {
		if ev.ID == "held" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	// Each round has a type of its own: a new consumer group of the SQL
	// transports reads its topic from the start.
	for partitions, typ := range map[int]framework.Definition[noteV1]{1: s.typ, 2: s.typ2} {
		s.tune = func(cfg *runner.Config) {
			cc := &cfg.Consumers[0]
			cc.Attempts, cc.MaxDeliveries, cc.Timeout, cc.Partitions = 1, 1, time.Minute, partitions
		}
		role := fmt.Sprintf("handback%d", partitions)
		name := s.consumer(role)
		p := s.start(t, name, 4, typ)
		s.publish(t, typ, s.message(t, typ, "notes", "held", "held"))
		select {
		case <-entered:
		case <-time.After(s.env.Timeout):
			t.Fatal("the held event's attempt did not start")
		}
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stopped <- p.runner.Stop(ctx)
		}()
		settle() // Stop closed the intake
		ids := s.publishN(t, typ, n, 0)
		settle() // they reached the process, or its transport's prefetch
		release <- struct{}{}
		require.NoError(t, <-stopped)
		p.stop()
		// Those that came before the intake closed took effect.
		require.Less(t, s.effects(t, name), n+1, "none was handed back")

		s.start(t, name, 4, typ)
		s.waitEffects(t, role, n+1)
		settle()
		s.requireExactlyOnce(t, role, append(ids, "held"))
		require.Empty(t, s.deadLetters(t, name), "a message handed back unhandled was charged")
	}
}
