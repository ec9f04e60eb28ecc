package middleware

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// timeout limits each attempt to d: the message context inside has a
// deadline, and an attempt that runs out fails with
// context.DeadlineExceeded (code timeout when no attempt is left). It sits
// inside retry, which restores the context between attempts. A
// non-positive d disables the limit.
func timeout(d time.Duration) message.HandlerMiddleware {
	if d <= 0 {
		return func(next message.HandlerFunc) message.HandlerFunc { return next }
	}
	return wmmiddleware.Timeout(d)
}
