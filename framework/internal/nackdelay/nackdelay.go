// Package nackdelay puts a pause between a nack and the redelivery it asks
// for, for transports that redeliver a nacked message at once
// (watermill-amqp requeues it, GoChannel sends it again): without it a
// message that keeps failing loops hot.
package nackdelay

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Backoff is the pause after a nack: First after the first of a row of
// nacks on one subscription, doubling with each further one up to Max, back
// to First after an ack.
type Backoff struct {
	First time.Duration
	Max   time.Duration
}

// next returns the pause after nacks consecutive nacks before this one.
func (b Backoff) next(nacks int) time.Duration {
	d := b.First
	for i := 0; i < nacks && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// Forward hands each message of in to out as a copy, with the original's
// context, and settles the original once the copy is settled: an ack at
// once, a nack after the backoff's pause. It returns when in closes.
//
// When closing closes or ctx ends, a message not yet handed out, or
// nacked and pausing, is nacked at once: the transport takes it back
// while it closes. A message whose context ends (its subscription
// stopped) is nacked too.
func Forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message, closing <-chan struct{}, b Backoff) {
	nacks := 0
	for orig := range in {
		msg := orig.Copy()
		msg.SetContext(orig.Context())
		select {
		case out <- msg:
		case <-closing:
			orig.Nack()
			continue // in closes soon
		case <-ctx.Done():
			orig.Nack()
			continue
		}
		select {
		case <-msg.Acked():
			nacks = 0
			orig.Ack()
		case <-msg.Nacked():
			t := time.NewTimer(b.next(nacks))
			nacks++
			select {
			case <-t.C:
			case <-closing:
			case <-ctx.Done():
			}
			t.Stop()
			orig.Nack()
		case <-orig.Context().Done():
			orig.Nack()
		}
	}
}
