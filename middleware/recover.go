package middleware

import (
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// recoverPanic turns a panic of an inner step or of the handler into an
// error (watermill's RecoveredPanicError), which framework.CodeOf
// classifies as code panic. Placed inside retry, a panicking attempt is
// retried like a failing one, and the consumer keeps running.
func recoverPanic(next message.HandlerFunc) message.HandlerFunc {
	return wmmiddleware.Recoverer(next)
}
