package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// retry runs each message up to attempts times with a constant delay
// between attempts, while the message stays unacknowledged. A permanent
// error (framework.Permanent) ends the retries at once, and so do
// pipeline.ErrLater and the end of the message context (shutdown). Each attempt starts from the message
// context retry received, so the inner steps (a timeout, a transaction)
// begin afresh. It is watermill's Retry, set up for constant delay. Each
// failed attempt is reported to observe, which logs it.
func retry(attempts int, delay time.Duration) message.HandlerMiddleware {
	r := wmmiddleware.Retry{
		MaxRetries:          attempts - 1,
		InitialInterval:     delay,
		MaxInterval:         delay,
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
		all := r.Middleware(counted)
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := all(msg)
			if err != nil {
				stateOf(msg).gaveUp = true
			}
			return out, err
		}
	}
}
