package middleware

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// TestClock is the clock of HandlerOnClock. Zero fields take the system's
// clock, and the hold-up figures the chain's.
type TestClock struct {
	Now                             func() time.Time
	After                           func(time.Duration) <-chan time.Time
	HoldUpLimit, ForgetFailingAfter time.Duration
}

// HandlerOnClock is Handler on clk.
func HandlerOnClock(cfg Config, clk TestClock) (message.NoPublishHandlerFunc, error) {
	c := systemClock()
	if clk.Now != nil {
		c.now = clk.Now
	}
	if clk.After != nil {
		c.after = clk.After
	}
	c.holdUpLimit, c.forgetFailingAfter = clk.HoldUpLimit, clk.ForgetFailingAfter
	return handler(cfg, c)
}

// DeadLetterStep is the dead-letter step on the system's clock.
func DeadLetterStep(consumer string, store framework.Store) message.HandlerMiddleware {
	return deadLetter(consumer, store, time.Now)
}

// DeliveryGuardStep is the delivery guard with the default limit and no
// unit of work.
func DeliveryGuardStep(consumer string, store framework.Store) message.HandlerMiddleware {
	return deliveryGuard(consumer, store, DefaultMaxDeliveries, nil)
}

// Dispatch is the innermost handler.
var Dispatch = dispatch
