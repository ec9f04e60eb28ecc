package middleware

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Timeout limits each attempt to d: the message context inside has a
// deadline, and an attempt that runs out fails with
// context.DeadlineExceeded (code timeout when no attempt is left). Place it
// inside Retry, which restores the context between attempts. A
// non-positive d disables the limit.
func Timeout(d time.Duration) message.HandlerMiddleware {
	if d <= 0 {
		return func(next message.HandlerFunc) message.HandlerFunc { return next }
	}
	return wmmiddleware.Timeout(d)
}
