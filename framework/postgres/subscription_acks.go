package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
)

// deliveryOf returns a new delivery of r, with a message of its own,
// which says whether it may be a redelivery (see redelivered).
func (sub *subscription) deliveryOf(r *row) *delivery {
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata) // never the producer's word on redelivery
	if said, known := sub.redelivered(r); known {
		msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(said))
	}
	ctx, cancel := context.WithCancel(sub.ctx)
	d := &delivery{sub: sub, r: r, msg: msg, cancel: cancel}
	if sub.reported {
		ctx = context.WithValue(ctx, deliveryKey{}, d)
	}
	msg.SetContext(ctx)
	return d
}

// deliveryKey keys the context value that makes a message's context tell
// its delivery, for Settle.
type deliveryKey struct{}

// Settle hands the outcome of msg, a message of s, to its subscription
// (see driver.Settler), for a reader that settles its messages itself
// (driver.SubscribeConfig.Settles). It ignores a message not of s.
func (s *subscriber) Settle(msg *message.Message, acked bool) {
	if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok && d.sub.s == s {
		d.Settled(acked)
	}
}

// redelivered tells whether r, about to be handed out, may have been
// handed out before: yes when this process did, or when it is at or below
// the group's handed-out position read when the lock was taken (another
// process, or this one before it lost its connection, handed it out, or
// read it to); no when it is after that position, since every read writes
// the position past its rows before they are handed out. known is false
// without the handed-out columns, and for the rows there when the lock
// was taken while the group's position was unknown (written by a
// subscriber that did not mark).
func (sub *subscription) redelivered(r *row) (said, known bool) {
	switch {
	case r.handedOut:
		return true, true
	case !sub.marking:
		return false, false
	case !sub.takenMark.less(r.pos):
		return true, true
	case r.pos.xid <= sub.unknownXID:
		return false, false
	}
	return false, true
}

// unsend forgets d, the current delivery of its row.
func (sub *subscription) unsend(d *delivery) {
	d.r.current = nil
	delete(sub.sent, d)
}

// dropNext forgets the delivery prepared for the queue's head.
func (sub *subscription) dropNext() {
	if sub.next != nil {
		sub.next.cancel()
		sub.next = nil
	}
}

// Settled cancels the message's context and hands its outcome to the run
// loop. After the subscription ended it drops it: the
// shutdown read the message's state itself.
func (d *delivery) Settled(acked bool) {
	d.cancel()
	select {
	case d.sub.results <- result{d: d, acked: acked}:
	case <-d.sub.ctx.Done():
	}
}

// resolve records an Ack or Nack: an Ack of any delivery of a row
// acknowledges it; a Nack of its current delivery hands it out again
// after ResendInterval.
func (sub *subscription) resolve(res result, now time.Time) {
	r := res.d.r
	current := r.current == res.d
	if current {
		sub.unsend(res.d)
	}
	if res.acked {
		r.acked = true
		sub.advance(now)
		return
	}
	if current && !r.acked {
		r.resendAt = now.Add(sub.s.cfg.ResendInterval)
		sub.waiting = append(sub.waiting, r)
	}
}

// advance moves the acknowledged position over the acknowledged rows at
// the head of the window: a row acknowledged out of order waits for those
// before it.
func (sub *subscription) advance(now time.Time) {
	n := 0
	for n < len(sub.window) && sub.window[n].acked {
		sub.acked = sub.window[n].pos
		n++
	}
	if n == 0 {
		return
	}
	clear(sub.window[:n])
	sub.window = sub.window[n:]
	if !sub.dirty {
		sub.dirtyAt = now
	}
	sub.dirty = true
	sub.dirtyN += n
}

// flushDue reports whether to write the acknowledged position now: a
// batch of rows is acknowledged, nothing is in flight or queued, or it
// waited ackFlushInterval; with marking, not when a read is due, which
// writes it.
func (sub *subscription) flushDue(now time.Time) bool {
	if !sub.dirty || (sub.marking && sub.readDue(now)) {
		return false
	}
	idle := len(sub.sent) == 0 && len(sub.queue) == 0
	return idle || sub.dirtyN >= sub.s.cfg.BatchSize || now.Sub(sub.dirtyAt) >= ackFlushInterval
}

// writeAcked writes the acknowledged position on the subscription's
// connection, which holds the group's lock.
func (sub *subscription) writeAcked() error {
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	_, err := sub.conn.ExecContext(ctx, sub.q.ack, sub.s.group, sub.acked.offset, strconv.FormatUint(sub.acked.xid, 10))
	if err != nil {
		return fmt.Errorf("write acknowledged offset %d: %w", sub.acked.offset, err)
	}
	sub.dirty, sub.dirtyN = false, 0
	return nil
}
