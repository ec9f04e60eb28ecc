package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
)

// deliveryOf returns a new delivery of r, with a message of its own,
// which says whether it may be a redelivery (see redelivered).
func (sub *subscription) deliveryOf(r *row) *delivery {
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata) // never the producer's word on redelivery
	if said, known := sub.redelivered(r); known {
		msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(said))
	}
	if !r.publishedAt.IsZero() {
		msg.Metadata.Set(framework.MetadataPublishedAt, r.publishedAt.UTC().Format(time.RFC3339Nano))
	}
	ctx, cancel := context.WithCancel(sub.ctx)
	if sub.partitioned() {
		ctx = driver.WithPartition(ctx, r.st.part)
	}
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
// its group's handed-out position read when the lock was taken (another
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
	case !r.st.takenMark.less(r.pos):
		return true, true
	case r.pos.xid <= r.st.unknownXID:
		return false, false
	}
	return false, true
}

// Hold frees the place of msg, a message of s handed out and not
// settled, for another message, while its subscription holds fewer than
// driver.SubscribeConfig.Hold so (see driver.Holder); its settling then
// frees none. Its row stays in its stream's window, which grows by the
// messages held.
func (s *subscriber) Hold(msg *message.Message) bool {
	d, ok := msg.Context().Value(deliveryKey{}).(*delivery)
	return ok && d.sub.s == s && d.sub.holds.Hold(&d.place)
}

// unsend forgets d, the current delivery of its row.
func (sub *subscription) unsend(d *delivery) {
	sub.holds.Settle(&d.place)
	d.r.current = nil
	d.r.st.inFlight--
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
// after ResendInterval, unless its stream is dropping. The outcome of a
// row whose stream ended is dropped: its position is written.
func (sub *subscription) resolve(res result, now time.Time) {
	r := res.d.r
	current := r.current == res.d
	if current {
		sub.unsend(res.d)
	}
	if r.st.gone {
		return
	}
	if res.acked {
		r.acked = true
		sub.advance(r.st, now)
		return
	}
	if current && !r.acked && !r.st.dropping {
		r.resendAt = now.Add(sub.s.cfg.ResendInterval)
		r.pending = true
		sub.waiting = append(sub.waiting, r)
	}
}

// advance moves st's acknowledged position over the acknowledged rows at
// the head of its window: a row acknowledged out of order waits for those
// before it.
func (sub *subscription) advance(st *stream, now time.Time) {
	n := 0
	for n < len(st.window) && st.window[n].acked {
		st.acked = st.window[n].pos
		n++
	}
	if n == 0 {
		return
	}
	clear(st.window[:n])
	st.window = st.window[n:]
	if !st.dirty {
		st.dirtyAt = now
	}
	st.dirty = true
	st.dirtyN += n
}

// dirtyStreams returns the locked streams whose acknowledged position is
// not written yet.
func (sub *subscription) dirtyStreams() []*stream {
	var dirty []*stream
	for _, st := range sub.streams {
		if st.locked && st.dirty {
			dirty = append(dirty, st)
		}
	}
	return dirty
}

// flushDue reports whether to write the acknowledged positions now: a
// batch of rows is acknowledged, nothing is in flight or queued, or one
// waited ackFlushInterval; with marking, not when a read is due, which
// writes them.
func (sub *subscription) flushDue(now time.Time) bool {
	var (
		dirty bool
		n     int
		at    time.Time
	)
	for _, st := range sub.streams {
		if !st.locked || !st.dirty {
			continue
		}
		if !dirty || st.dirtyAt.Before(at) {
			at = st.dirtyAt
		}
		dirty = true
		n += st.dirtyN
	}
	if !dirty || (sub.marking && sub.readDue(now)) {
		return false
	}
	idle := len(sub.sent) == 0 && len(sub.queue) == 0
	return idle || n >= sub.s.cfg.BatchSize || now.Sub(at) >= ackFlushInterval
}

// writeAcked writes the acknowledged positions of streams, which are
// locked, on the subscription's connection: in one statement.
func (sub *subscription) writeAcked(streams []*stream) error {
	if len(streams) == 0 {
		return nil
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	var err error
	if !sub.partitioned() {
		st := streams[0]
		_, err = sub.conn.ExecContext(ctx, sub.q.ack, st.group, st.acked.offset, strconv.FormatUint(st.acked.xid, 10))
	} else {
		groups, offsets, xids := make([]string, len(streams)), make([]int64, len(streams)), make([]string, len(streams))
		for i, st := range streams {
			groups[i], offsets[i], xids[i] = st.group, st.acked.offset, strconv.FormatUint(st.acked.xid, 10)
		}
		_, err = sub.conn.ExecContext(ctx, sub.q.ackParts, groups, offsets, xids)
	}
	if err != nil {
		return fmt.Errorf("write acknowledged offset %d of %s: %w", streams[0].acked.offset, streams[0].group, err)
	}
	for _, st := range streams {
		st.dirty, st.dirtyN = false, 0
	}
	return nil
}
