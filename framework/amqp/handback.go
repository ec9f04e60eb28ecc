package amqp

import (
	"context"
	"time"
)

// handBackTime bounds how long the end of a subscription whose reader
// settles its messages itself spends handing them the deliveries that
// the broker sent before the consumer's cancel, and waiting for them to
// be settled (see ender). What is left once it is over is requeued
// unsettled, when the channel closes.
const handBackTime = 5 * time.Second

// ender is the end of one consume: the subscription's context ending or
// its subscriber closing. Without a reader that settles its messages
// itself, the consume returns at once: closing the channel requeues the
// deliveries that the broker sent and the reader never saw (up to the
// channel's prefetch), and RabbitMQ flags them redelivered.
//
// With such a reader (driver.SubscribeConfig.Settles: the runner), the
// consume ends as a dropped partition does: it cancels its consumer,
// hands out what the broker sent before, and waits until the reader
// settled every delivery, for handBackTime at most. The reader, which
// is stopping, refuses them, and records a first delivery among them as
// costing nothing before it nacks it: its redelivery, flagged, is not
// charged as a second delivery (see driver.Store.Count). Without it,
// every stop would make up to a prefetch of messages that nothing
// handled look delivered before.
type ender struct {
	// ending closes when the subscription's context ends or its
	// subscriber closes; nil once the end began.
	ending <-chan struct{}
	// release lets go of what ending needs, once the consume returned.
	release func()
	// over closes once the end's handBackTime is over; nil before the
	// end began.
	over <-chan time.Time
	// handsBack says that the end hands out what is left (see ender).
	handsBack bool
}

// ender returns the ender of a consume of s under ctx; the consume calls
// its release once it returns.
func (s *subscription) ender(ctx context.Context) *ender {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return &ender{ending: ctx.Done(), release: cancel, handsBack: s.reported}
}

// begin begins the end, cancelling the consumer with cancel (unless
// nil), and reports whether the consume returns now, without handing
// out what is left.
func (e *ender) begin(cancel func()) (now bool) {
	if !e.handsBack {
		return true
	}
	e.ending = nil
	e.over = time.After(handBackTime)
	if cancel != nil {
		cancel()
	}
	return false
}
