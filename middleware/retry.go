package middleware

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Defaults of RetryConfig.
const (
	DefaultAttempts   = 3
	DefaultRetryDelay = time.Second
)

// RetryConfig configures Retry.
type RetryConfig struct {
	// Attempts is the number of attempts, the first included. Defaults to
	// DefaultAttempts.
	Attempts int
	// Delay is the constant pause between attempts. Defaults to
	// DefaultRetryDelay.
	Delay time.Duration
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c RetryConfig) WithDefaults() RetryConfig {
	c.Attempts = cmp.Or(c.Attempts, DefaultAttempts)
	c.Delay = cmp.Or(c.Delay, DefaultRetryDelay)
	return c
}

// Validate reports the first invalid field of c.
func (c RetryConfig) Validate() error {
	if c.Attempts < 1 {
		return fmt.Errorf("retry: Attempts must be at least 1, got %d", c.Attempts)
	}
	if c.Delay < 0 {
		return fmt.Errorf("retry: Delay must not be negative, got %s", c.Delay)
	}
	return nil
}

// Retry runs each message up to cfg.Attempts times with a constant delay
// between attempts, while the message stays unacknowledged. A permanent
// error (framework.Permanent) ends the retries at once, and so do
// pipeline.ErrLater and the end of the message context (shutdown). Each attempt starts from the message
// context Retry received, so the inner steps (a timeout, a transaction)
// begin afresh. It is watermill's Retry, set up for constant delay. Each
// failed attempt is reported to Observe, which logs it.
func Retry(cfg RetryConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	retry := wmmiddleware.Retry{
		MaxRetries:          cfg.Attempts - 1,
		InitialInterval:     cfg.Delay,
		MaxInterval:         cfg.Delay,
		Multiplier:          1,
		RandomizationFactor: 0,
		MaxElapsedTime:      0,
		ResetContextOnRetry: true,
		ShouldRetry: func(p wmmiddleware.RetryParams) bool {
			return !framework.IsPermanent(p.Err) && !errors.Is(p.Err, pipeline.ErrLater)
		},
	}
	return func(next message.HandlerFunc) message.HandlerFunc {
		counted := func(msg *message.Message) ([]*message.Message, error) {
			st, ctx := stateOf(msg), msg.Context()
			st.attempts++
			out, err := next(msg)
			if err != nil && st.attemptFailed != nil && ctx.Err() == nil && !errors.Is(err, pipeline.ErrLater) {
				st.attemptFailed(ctx, err)
			}
			return out, err
		}
		attempts := retry.Middleware(counted)
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := attempts(msg)
			if err != nil {
				stateOf(msg).gaveUp = true
			}
			return out, err
		}
	}, nil
}
