package runner

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/time/rate"
)

// rateLimit caps a consumer's messages per second. A message waiting for
// its turn when the runner stops is nacked.
func rateLimit(perSecond float64) message.HandlerMiddleware {
	limiter := rate.NewLimiter(rate.Limit(perSecond), 1)
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if err := limiter.Wait(msg.Context()); err != nil {
				return nil, fmt.Errorf("rate limit: %w", err)
			}
			return next(msg)
		}
	}
}
