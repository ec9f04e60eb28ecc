package runnertest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/middleware"
)

// caseBreaker: while a dependency is down the consumer's breaker opens
// (no message is dead-lettered for the failures that open it: attempts as
// many as the failures that open it); the messages then wait at it and
// are released at max_hold, again, neither counted as deliveries (at
// max_deliveries 2, a message released twice and counted each time would
// be dead-lettered as delivery_limit when it comes through) nor
// dead-lettered. Once the dependency is back a probe closes the breaker
// and every event takes effect once. With group commit on, as by default.
func caseBreaker(t *testing.T, s *suite) {
	var outage atomic.Bool
	outage.Store(true)
	s.setBehave(func(string, framework.Event[noteV1], int) error {
		if outage.Load() {
			return framework.Dependency(errTransient)
		}
		return nil
	})
	releases := &releaseLog{byID: make(map[string]int)}
	metrics, err := middleware.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s.tune = func(cfg *runner.Config) {
		cc := &cfg.Consumers[0]
		cc.Attempts, cc.MaxDeliveries = 3, 2
		// The cool-down outlasts the releases the test waits for: no
		// probe fails.
		cc.Breaker = middleware.BreakerConfig{Failures: 3, CoolDown: 8 * time.Second, MaxHold: 200 * time.Millisecond}
		cfg.Logger = slog.New(releases)
		cfg.Metrics = metrics
	}
	name := s.consumer("breaker")
	s.start(t, name, 4, s.typ)
	// Few events: the transports that double their pause after each
	// nack (memory, amqp) hand each one back soon enough.
	ids := s.publishN(t, s.typ, 3, 0)
	s.waitFor(t, "a message released twice", func() bool { return releases.most() >= 2 })
	require.Equal(t, []middleware.BreakerStatus{{Consumer: name, State: middleware.BreakerOpen}}, metrics.Breakers())
	outage.Store(false)
	s.waitEffects(t, "breaker", len(ids))
	settle()
	s.requireExactlyOnce(t, "breaker", ids)
	require.Empty(t, s.deadLetters(t, name))
	require.Equal(t, []middleware.BreakerStatus{{Consumer: name, State: middleware.BreakerClosed}}, metrics.Breakers())
}

// releaseLog is a slog handler that counts, per event id, the messages
// the breaker released (nacked at max_hold).
type releaseLog struct {
	mu   sync.Mutex
	byID map[string]int
}

// Enabled implements slog.Handler.
func (l *releaseLog) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *releaseLog) Handle(_ context.Context, r slog.Record) error {
	var id string
	released := false
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "event_id":
			id = a.Value.String()
		case "error":
			released = strings.Contains(a.Value.String(), "message released")
		}
		return true
	})
	if released && id != "" {
		l.mu.Lock()
		l.byID[id]++
		l.mu.Unlock()
	}
	return nil
}

// WithAttrs implements slog.Handler.
func (l *releaseLog) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *releaseLog) WithGroup(string) slog.Handler { return l }

// most returns the most releases of one event.
func (l *releaseLog) most() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.byID {
		n = max(n, c)
	}
	return n
}
