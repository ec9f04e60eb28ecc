package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/middleware"
)

// TestHandlingTimeHoldsAtBreaker: a consumer with a breaker may hold a
// message up to its MaxHold before its attempts, so the time the
// transport gives a message (the PostgreSQL ack deadline) grows by it.
func TestHandlingTimeHoldsAtBreaker(t *testing.T) {
	t.Parallel()
	cc := ConsumerConfig{Settings: middleware.Settings{Attempts: 3, Timeout: 10 * time.Second, RetryDelay: time.Second}}
	require.Equal(t, 33*time.Second, cc.WithDefaults().handlingTime())
	cc.Breaker = middleware.BreakerConfig{Failures: 5}
	require.Equal(t, 33*time.Second+middleware.DefaultBreakerMaxHold, cc.WithDefaults().handlingTime())
	cc.Breaker.MaxHold = 2 * time.Minute
	require.Equal(t, 33*time.Second+2*time.Minute, cc.WithDefaults().handlingTime())
}
