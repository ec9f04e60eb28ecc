package middleware

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
)

// TestClock is the clock of HandlerOnClock. Zero fields take the system's
// clock, and the hold-up figures the chain's.
type TestClock struct {
	Now                             func() time.Time
	After                           func(time.Duration) <-chan time.Time
	HoldUpLimit, ForgetFailingAfter time.Duration
	// ReleaseSweep replaces DefaultReleaseSweep.
	ReleaseSweep time.Duration
}

// HandlerOnClock is Handler on clk, without its sweep.
func HandlerOnClock(cfg Config, clk TestClock) (message.NoPublishHandlerFunc, error) {
	h, _, err := HandlerWithSweepOnClock(cfg, clk)
	return h, err
}

// HandlerWithSweepOnClock is Handler on clk.
func HandlerWithSweepOnClock(cfg Config, clk TestClock) (message.NoPublishHandlerFunc, func(context.Context), error) {
	c := systemClock()
	if clk.Now != nil {
		c.now = clk.Now
	}
	if clk.After != nil {
		c.after = clk.After
	}
	if clk.ReleaseSweep > 0 {
		c.releaseSweep = clk.ReleaseSweep
	}
	c.holdUpLimit, c.forgetFailingAfter = clk.HoldUpLimit, clk.ForgetFailingAfter
	return handler(cfg, c)
}

// DeadLetterStep is the dead-letter step on the system's clock.
func DeadLetterStep(consumer string, store driver.Store) message.HandlerMiddleware {
	return deadLetter(consumer, store, time.Now, false)
}

// DeliveryGuardStep is the delivery guard with the default limit and no
// unit of work.
func DeliveryGuardStep(consumer string, store driver.Store) message.HandlerMiddleware {
	return deliveryGuard(consumer, store, DefaultMaxDeliveries, DefaultTimeout, nil, nil, nil)
}

// Dispatch is the innermost handler.
var Dispatch = dispatch
