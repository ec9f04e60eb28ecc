package middleware

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/time/rate"
)

// rateLimit caps the messages per second that pass it, in this process: a
// message waits for its turn, on clk. A message whose context ends while
// it waits is nacked, its turn handed back.
func rateLimit(perSecond float64, clk clock) message.HandlerMiddleware {
	limiter := rate.NewLimiter(rate.Limit(perSecond), 1)
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			now := clk.now()
			r := limiter.ReserveN(now, 1)
			if wait := r.DelayFrom(now); wait > 0 {
				select {
				case <-clk.after(wait):
				case <-msg.Context().Done():
					r.CancelAt(clk.now())
					return nil, fmt.Errorf("rate limit: %w", msg.Context().Err())
				}
			}
			return next(msg)
		}
	}
}
