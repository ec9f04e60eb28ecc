package amqp

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// consumption is what one consume's deliveries share: its channel's
// acker, and the deliveries handed out and not yet settled, which its
// end settles (abandon).
type consumption struct {
	sub      *subscription
	ctx      context.Context // the subscription's
	acks     *acker
	dead     chan struct{}  // closed when the channel is lost
	inFlight sync.WaitGroup // the deliveries not finished, a nack's pause included
	watchers sync.WaitGroup // for a reader that does not report

	mu   sync.Mutex
	live map[*delivery]struct{} // handed out and not claimed
}

// add returns the delivery of msg, tagged tag on the channel, in flight
// and not settled.
func (c *consumption) add(tag uint64, msg *message.Message, cancel context.CancelFunc) *delivery {
	d := &delivery{c: c, tag: tag, msg: msg, cancel: cancel}
	c.inFlight.Add(1)
	c.mu.Lock()
	c.live[d] = struct{}{}
	c.mu.Unlock()
	return d
}

// abandon settles, once the consume ended, the deliveries not yet
// settled: dropped when the channel was lost (the broker requeues them,
// and their tags mean nothing on another channel; their redeliveries
// are not charged, see lostDeliveries), otherwise acked if the reader
// acked them already and nacked (requeued) if not.
func (c *consumption) abandon(lost bool) {
	c.mu.Lock()
	ds := make([]*delivery, 0, len(c.live))
	for d := range c.live {
		ds = append(ds, d)
	}
	c.mu.Unlock()
	for _, d := range ds {
		if !d.claim() {
			continue
		}
		if lost {
			c.sub.conn.lost.add(c.sub.queue, d.msg.UUID)
		} else {
			select {
			case <-d.msg.Acked(): // acked as the subscriber closed: keep the ack
				c.acks.settle(d.tag, true)
			default:
				c.acks.settle(d.tag, false)
			}
		}
		d.finish()
	}
}

// delivery is a message that consume handed out, settled once (claim):
// when the reader reports its Ack or Nack (Settled; for a reader that
// does not report, a goroutine watches the message and reports it), or,
// when its consume ends first, by abandon.
type delivery struct {
	c      *consumption
	tag    uint64
	msg    *message.Message
	cancel context.CancelFunc
	taken  atomic.Bool
	place  subscribers.Place // in its slot, or held out of it (subscriber.Hold)
}

// claim reports whether the caller is the one to settle d.
func (d *delivery) claim() bool {
	if !d.taken.CompareAndSwap(false, true) {
		return false
	}
	d.c.mu.Lock()
	delete(d.c.live, d)
	d.c.mu.Unlock()
	return true
}

// watch reports the message's Ack or Nack, for a reader that does not,
// until its consume ends (ctx, the subscriber's close or the channel's
// loss: abandon settles it then).
func (d *delivery) watch() {
	select {
	case <-d.msg.Acked():
		d.Settled(true)
	case <-d.msg.Nacked():
		d.Settled(false)
	case <-d.c.sub.closing:
	case <-d.c.ctx.Done():
	case <-d.c.dead:
	}
}

// finish cancels the message's context and frees its slot, or its
// place among those held.
func (d *delivery) finish() {
	d.cancel()
	if !d.c.sub.holds.Settle(&d.place) {
		<-d.c.sub.slots
	}
	d.c.inFlight.Done()
}

// hold frees d's slot, while it is in flight and the subscription holds
// fewer than its subscriber's hold: d is held (see subscriber.Hold).
func (d *delivery) hold() bool {
	if !d.c.sub.holds.Hold(&d.place) {
		return false
	}
	<-d.c.sub.slots
	return true
}

// Settled acks the delivery on its channel, or nacks it after the
// subscription's pause on a goroutine of its own.
// Once its consume ended (abandon), it does nothing: a late ack is
// dropped, and the message comes again.
func (d *delivery) Settled(acked bool) {
	if !d.claim() {
		return
	}
	c := d.c
	if acked {
		c.sub.nacks.Acked()
		c.acks.settle(d.tag, true)
		d.finish()
		return
	}
	go func() {
		defer d.finish()
		if c.sub.pause(c.ctx, c.dead) {
			c.acks.settle(d.tag, false)
		}
	}()
}
