package middleware

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// timeout limits each attempt to d: the message context inside has a
// deadline, and an attempt that runs out fails with
// context.DeadlineExceeded (code timeout when no attempt is left). It sits
// inside retry, which restores the context between attempts. d is
// positive (Settings.Validate).
func timeout(d time.Duration) message.HandlerMiddleware {
	return wmmiddleware.Timeout(d)
}
