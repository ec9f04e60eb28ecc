package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/bound"
)

// position is a row's place in a topic: rows are read in this order.
type position struct {
	xid    uint64
	offset int64
}

func (p position) less(o position) bool {
	return p.xid < o.xid || (p.xid == o.xid && p.offset < o.offset)
}

// row is a message read from the topic and not yet acknowledged in
// order.
type row struct {
	st                *stream // the position it was read from
	pos               position
	uuid              string
	payload, metadata []byte
	acked             bool
	current           *delivery // handed out and not yet resolved
	queued            bool      // waits in the queue to be handed out
	pending           bool      // nacked: waits in waiting until resendAt
	resendAt          time.Time // nacked: handed out again then
	handedOut         bool      // this process handed it out before
	publishedAt       time.Time // when it was published, on this process's clock (see publishedAt); zero if unknown
}

// delivery is one handing out of a row.
type delivery struct {
	sub    *subscription
	r      *row
	msg    *message.Message
	cancel context.CancelFunc
	sentAt time.Time
	place  subscribers.Place // in a place of the concurrency, or held out of it (subscriber.Hold)
}

type result struct {
	d     *delivery
	acked bool
}

// waiter is a goroutine that waits on the subscription's connection for a
// notification, which it sends on done, as it ends.
type waiter struct {
	cancel context.CancelFunc
	done   chan wake // buffered: receives once
}

// wake is how a waiter ended.
type wake struct {
	notified bool
	xid      uint64 // the notifying transaction, zero when unknown
	err      error  // the connection failed
}

// subscription is the state of one Subscribe call, owned by its run
// goroutine.
type subscription struct {
	s       *subscriber
	topic   string
	q       subscriptionQueries
	ctx     context.Context
	cancel  context.CancelFunc
	out     chan *message.Message
	results chan result
	log     *slog.Logger
	// reported says that the reader reports each message's outcome
	// (subscriber.Settle): no goroutine watches a message then.
	reported bool
	msgWG    sync.WaitGroup // the goroutines watching messages

	conn    *sql.Conn // nil until connected
	retryAt time.Time // when to connect or try the locks again
	// bound bounds each statement on conn, and the making of conn:
	// queryTimeout, doubled by each statement cut short since the last
	// step that completed.
	bound *bound.Statement

	// With marking, the group's row holds its handed-out position (see
	// handedOutColumns), and each delivery says whether it may be a
	// redelivery (see redelivered).
	marking bool
	// streams are the subscription's positions, by partition: the
	// group's alone when the consumer is not partitioned, else those of
	// the partitions assigned (see subscriber.Assign).
	streams  []*stream
	assign   chan assignment // Assign's new partitions
	dropped  []chan struct{} // closed once no stream is dropping
	finished chan struct{}   // closed when run returns

	listening    bool          // conn LISTENs on the topic's channel
	listenWarned bool          // a failed LISTEN was logged
	waiter       *waiter       // waits on conn for a notification, while idle
	notifiedXID  uint64        // the newest notified transaction, until read past
	notifyRetry  time.Duration // the pause before reading again for notifiedXID
	horizon      uint64        // partitioned: every transaction below it had ended at the last read

	next    *delivery              // of the queue's head, while it waits to be taken
	queue   []*row                 // to hand out, in order: rows of locked streams not dropping
	waiting []*row                 // nacked, until their resendAt
	sent    map[*delivery]struct{} // handed out and not yet resolved
	// sentOrder holds the deliveries of sent in the order they were
	// handed out, so by sentAt, and some resolved since (see expire).
	sentOrder []*delivery
	holds     *subscribers.Holds // the deliveries of sent held out of the concurrency (subscriber.Hold)
	readAt    time.Time          // when to look for new rows again (zero: now)
}

func (sub *subscription) run() {
	defer sub.s.wg.Done()
	defer close(sub.finished)
	defer sub.s.forget(sub)
	defer close(sub.out)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if sub.ctx.Err() != nil {
			sub.shutdown()
			return
		}
		now := time.Now()
		sub.step(now)

		var out chan<- *message.Message
		var msg *message.Message
		if len(sub.queue) > 0 && len(sub.sent)-sub.holds.Held() < sub.s.concurrency {
			if sub.next == nil || sub.next.r != sub.queue[0] {
				sub.dropNext()
				sub.next = sub.deliveryOf(sub.queue[0])
			}
			out, msg = sub.out, sub.next.msg
		}
		if sub.waiter == nil && sub.idle(now) {
			sub.startWaiting(sub.readAt)
		}
		var woke <-chan wake
		if sub.waiter != nil {
			woke = sub.waiter.done
		}
		timer.Reset(sub.wakeAt(now).Sub(now))
		select {
		case <-sub.ctx.Done():
		case a := <-sub.assign:
			sub.reassign(a)
		case w := <-woke:
			if err := sub.woke(w); err != nil {
				sub.lost("wait for notifications", err)
			}
		case out <- msg:
			d := sub.next
			sub.next = nil
			sub.queue[0] = nil
			sub.queue = sub.queue[1:]
			d.r.queued = false
			d.r.current = d
			d.r.handedOut = true
			d.r.st.inFlight++
			if d.r.st.handedHigh.less(d.r.pos) {
				d.r.st.handedHigh = d.r.pos
			}
			d.sentAt = time.Now()
			sub.sent[d] = struct{}{}
			sub.sentOrder = append(sub.sentOrder, d)
			if !sub.reported {
				sub.msgWG.Go(func() { subscribers.Watch(sub.ctx, d.msg, d) })
			}
		case res := <-sub.results:
			sub.resolve(res, time.Now())
		case <-sub.holds.Wake():
		case <-timer.C:
		}
	}
}

// step does what is due: end the dropped streams whose messages all
// settled, take the locks, write the acknowledged positions, read new
// rows, queue the nacked rows whose pause passed and the rows whose
// delivery outlived the ack deadline.
func (sub *subscription) step(now time.Time) {
	sub.endDrops()
	if sub.wantsLock() && !now.Before(sub.retryAt) {
		if err := sub.acquire(now); err != nil {
			sub.lost("take the group's lock", err)
			return
		}
	}
	if !sub.active() {
		return
	}
	if sub.flushDue(now) {
		if err := sub.writeAcked(sub.dirtyStreams()); err != nil {
			sub.lost("write the acknowledged position", err)
			return
		}
	}
	if sub.readDue(now) {
		if err := sub.read(now); err != nil {
			sub.lost("read messages", err)
			return
		}
	}
	kept := sub.waiting[:0]
	for _, r := range sub.waiting {
		switch {
		case r.acked || r.st.dropping || r.st.gone:
			r.pending = false
		case !now.Before(r.resendAt):
			r.pending = false
			sub.enqueue(r)
		default:
			kept = append(kept, r)
		}
	}
	clear(sub.waiting[len(kept):])
	sub.waiting = kept
	for len(sub.queue) > 0 && sub.queue[0].acked { // a late Ack of a row given up
		sub.queue[0].queued = false
		sub.queue[0] = nil
		sub.queue = sub.queue[1:]
	}
	sub.expire(now)
	sub.bound.Reset() // what was due completed
}

// expire hands out again the deliveries that outlived the ack deadline
// (a late Ack still counts). They are the oldest of sentOrder: it drops
// the resolved deliveries it passes on its way from the oldest, and once
// they outnumber the others it keeps only those not resolved. So a step
// looks at the oldest deliveries only, not at every one in flight.
func (sub *subscription) expire(now time.Time) {
	for len(sub.sentOrder) > 0 {
		d := sub.sentOrder[0]
		if _, live := sub.sent[d]; live {
			if now.Sub(d.sentAt) < sub.s.cfg.AckDeadline {
				break
			}
			sub.unsend(d)
			sub.enqueue(d.r)
		}
		sub.sentOrder[0] = nil
		sub.sentOrder = sub.sentOrder[1:]
	}
	if len(sub.sentOrder) > 2*len(sub.sent)+64 {
		kept := sub.sentOrder[:0]
		for _, d := range sub.sentOrder {
			if _, live := sub.sent[d]; live {
				kept = append(kept, d)
			}
		}
		clear(sub.sentOrder[len(kept):])
		sub.sentOrder = kept
	}
}

// enqueue queues r to be handed out, unless it is queued or acknowledged
// already, or its stream is not locked or is dropping (see requeue).
func (sub *subscription) enqueue(r *row) {
	if r.queued || r.acked || !r.st.locked || r.st.dropping {
		return
	}
	r.queued = true
	sub.queue = append(sub.queue, r)
}

// wakeAt returns when step has something to do next, at the latest an
// hour from now.
func (sub *subscription) wakeAt(now time.Time) time.Time {
	at := now.Add(time.Hour)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	if sub.wantsLock() {
		earlier(sub.retryAt)
	}
	if !sub.active() {
		return at
	}
	if len(sub.queue) == 0 && sub.readAt.After(now) {
		earlier(sub.readAt)
	}
	for _, st := range sub.streams {
		if st.dirty {
			earlier(st.dirtyAt.Add(ackFlushInterval))
		}
	}
	for _, r := range sub.waiting {
		earlier(r.resendAt)
	}
	if len(sub.sentOrder) > 0 { // the oldest in flight, or one resolved since (expire drops it)
		earlier(sub.sentOrder[0].sentAt.Add(sub.s.cfg.AckDeadline))
	}
	return at
}

// idle reports whether the subscription waits for new rows only, to be
// woken by a notification.
func (sub *subscription) idle(now time.Time) bool {
	return sub.active() && sub.listening && len(sub.queue) == 0 && sub.readAt.After(now)
}

// startWaiting starts a waiter on the connection, until a notification
// comes, until, or stopWaiting.
func (sub *subscription) startWaiting(until time.Time) {
	ctx, cancel := context.WithDeadline(sub.ctx, until)
	w := &waiter{cancel: cancel, done: make(chan wake, 1)}
	conn := sub.conn
	go func() {
		defer cancel()
		w.done <- waitForNotification(ctx, conn)
	}()
	sub.waiter = w
}

// stopWaiting ends the waiter, if any, before the connection is used,
// recording a notification it received. An error of the connection is
// left to the statement that follows.
func (sub *subscription) stopWaiting() {
	if sub.waiter == nil {
		return
	}
	sub.waiter.cancel()
	_ = sub.woke(<-sub.waiter.done)
}

// woke records how the waiter ended: a notification reads at once. It
// returns the waiter's error.
func (sub *subscription) woke(w wake) error {
	sub.waiter = nil
	if w.notified {
		sub.readAt = time.Time{}
		sub.notifiedXID = max(sub.notifiedXID, w.xid)
		sub.notifyRetry = 0
	}
	return w.err
}

// waitForNotification waits on conn, which LISTENs, for a notification
// until ctx ends. pgx keeps the notifications that come during other
// statements for the next wait, and the context's end interrupts the
// wait without closing the connection.
func waitForNotification(ctx context.Context, conn *sql.Conn) wake {
	var n *pgconn.Notification
	err := conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("wait for a notification: driver connection %T is not pgx's", dc)
		}
		var err error
		n, err = c.Conn().WaitForNotification(ctx)
		return err
	})
	switch {
	case n != nil:
		xid, _ := strconv.ParseUint(n.Payload, 10, 64) // another payload: just a wake-up
		return wake{notified: true, xid: xid}
	case err != nil && ctx.Err() == nil:
		return wake{err: fmt.Errorf("wait for a notification: %w", err)}
	}
	return wake{}
}

// listen makes the connection LISTEN on the topic's channel. Without it
// (logged once), the subscription polls.
func (sub *subscription) listen(ctx context.Context) {
	if _, err := sub.conn.ExecContext(ctx, sub.q.listen); err != nil {
		if !sub.listenWarned {
			sub.listenWarned = true
			sub.log.Warn("postgres subscriber: could not LISTEN; polling every PollInterval",
				slog.Any("error", err), slog.Duration("poll_interval", sub.s.cfg.PollInterval))
		}
		return
	}
	sub.listening = true
}

// shutdown ends the subscription: it cancels the message contexts,
// writes the acknowledged positions, and releases the locks.
func (sub *subscription) shutdown() {
	sub.cancel()
	sub.stopWaiting()
	sub.dropNext()
	sub.msgWG.Wait()
	for d := range sub.sent {
		select {
		case <-d.msg.Acked():
			d.r.acked = true
		default:
		}
		d.cancel()
	}
	defer sub.endDropWaits()
	now := time.Now()
	for _, st := range sub.streams {
		sub.advance(st, now)
	}
	if sub.conn == nil {
		return
	}
	if dirty := sub.dirtyStreams(); len(dirty) > 0 {
		if err := sub.writeAcked(dirty); err != nil {
			sub.log.Warn("postgres subscriber: could not write the acknowledged position on close; those messages come again",
				slog.Any("error", err))
		}
	}
	ctx, cancel := sub.queryContext()
	defer cancel()
	for _, st := range sub.streams {
		if !st.locked {
			continue
		}
		if err := sub.lower(ctx, st); err != nil {
			sub.log.Warn("postgres subscriber: could not write the handed-out position on close; the messages read ahead come again as redeliveries",
				slog.Any("error", err))
		}
		if _, err := sub.conn.ExecContext(ctx, sub.q.unlock, st.key); err != nil {
			sub.discard()
			return
		}
		st.locked = false
	}
	if sub.listening {
		if _, err := sub.conn.ExecContext(ctx, sub.q.unlisten); err != nil {
			sub.discard()
			return
		}
	}
	_ = sub.conn.Close()
	sub.conn, sub.listening = nil, false
}

// lower writes st's handed-out position back to the last row it handed
// out, when it read further (with marking): nothing of st is handed out
// any more, so the rows read but never handed out are first deliveries
// for the next subscription. The position stays at least where it was
// when the lock was taken, since the rows before it may have been handed
// out by another.
func (sub *subscription) lower(ctx context.Context, st *stream) error {
	if !sub.marking {
		return nil
	}
	last := st.handedHigh
	if last.less(st.takenMark) {
		last = st.takenMark
	}
	if _, err := sub.conn.ExecContext(ctx, sub.q.lower, st.group, strconv.FormatUint(last.xid, 10), last.offset); err != nil {
		return fmt.Errorf("lower the handed-out position of %s: %w", st.group, err)
	}
	return nil
}
