package runner

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// intake counts the messages in flight, and holds those that come once
// Stop closed the intake until the router closes, then nacks them: they
// are never handled by this runner, and a first delivery among them is
// recorded as costing nothing first (see handBack), before the wait:
// once the router closes, the subscription may settle what is left
// itself. It acks or nacks each message itself
// and reports which to its subscriber (see settle), whose subscriptions
// then need no goroutine per message to watch for it (see
// driver.SubscribeConfig.Settles).
func (r *Runner) intake(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if seq := r.sequencers[message.HandlerNameFromCtx(msg.Context())]; seq != nil {
			defer seq.done(msg) // after settle: the next event of its subject may go
		}
		if !r.enter() {
			r.handBacks[message.HandlerNameFromCtx(msg.Context())].record(msg)
			select {
			case <-r.closing:
			case <-msg.Context().Done():
			}
			err := errors.New("runner: stopping: message not handled")
			r.settle(msg, err)
			return nil, err
		}
		defer r.leave()
		if f := r.flights(); f != nil {
			f.enter(msg)
			defer f.leave(msg)
		}
		out, err := r.workers.Handle(h, msg)
		if err == nil && len(out) > 0 {
			// The ack below would come before the router publishes them.
			// No step of the chain returns messages: follow-up events go
			// through the outbox.
			out, err = nil, fmt.Errorf("runner: the chain returned %d messages to publish", len(out))
		}
		r.settle(msg, err)
		return out, err
	}
}

// settle acks msg when err is nil and nacks it otherwise, as the router
// does once its handler returns, and tells the subscriber of msg's
// router handler, a driver.Settler, which of the two msg got (an Ack
// or Nack of the chain's own comes first). It does nothing to a message
// of a subscriber that is no Settler: the router acks or nacks it.
func (r *Runner) settle(msg *message.Message, err error) {
	s, ok := r.settlers[message.HandlerNameFromCtx(msg.Context())]
	if !ok {
		return
	}
	s.Settle(msg, pipeline.AckOrNack(msg, err))
}

// enter counts a message in flight, unless the intake is closed.
func (r *Runner) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return false
	}
	r.inFlight++
	return true
}

// leave counts a message out of flight.
func (r *Runner) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight--
	if r.stopping && r.inFlight == 0 {
		close(r.idle)
	}
}

// untilRunning holds every message until the router runs, that is until
// every handler has subscribed. Otherwise an attempt of the first handler
// could hold what a later handler's Subscribe needs (a connection, a
// SQLite file's write lock) and the start would wait for the attempt.
// A message whose context ends meanwhile is nacked. Once the router runs,
// the message's context is not asked for its Done channel, which a
// cancelable context makes on the first call: one allocation a message.
func untilRunning(router *message.Router) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			select {
			case <-router.Running():
				return h(msg)
			default:
			}
			select {
			case <-router.Running():
				return h(msg)
			case <-msg.Context().Done():
				return nil, fmt.Errorf("router not running yet: %w", msg.Context().Err())
			}
		}
	}
}
