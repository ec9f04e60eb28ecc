package amqp

import "time"

// settler is what an acker settles deliveries on: an amqp091 channel.
type settler interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// ackOp is what the acker learns about a delivery, in the order it
// happens: handed out, then acked or nacked (to be requeued).
type ackOp uint8

const (
	opAdd ackOp = iota
	opAck
	opNack
)

// ackEvent is one thing the acker learns about the delivery tag.
type ackEvent struct {
	tag uint64
	op  ackOp
}

// acker settles the deliveries of one channel, in fewer frames than one
// per delivery where it safely can. A batch of messages commits at once,
// so their acks come in bursts: the acker takes every event that waits,
// then acknowledges the run of settled deliveries at the front of the
// ones handed out (the oldest) with one multiple ack. A multiple ack
// acknowledges every unacknowledged tag up to its own, so it is only sent
// when each of them is settled; its own tag must still be unacknowledged
// (RabbitMQ closes the channel on an unknown tag), and each tag is
// settled once.
//
// The batches in flight commit in any order, and a batch's messages are
// rarely the oldest handed out: without holding, most acks (62% in a drain
// of the AMQP benchmark) went out one frame each, behind an older
// delivery still unsettled. So an ack behind an unsettled delivery is
// held, up to holdMax of them and for holdFor at most, and goes out in the
// multiple ack of the front once the deliveries before it settle; past
// either bound the held acks go out one by one. A held ack stays
// unacknowledged at the broker, where it counts against the channel's
// prefetch: the subscription's prefetch leaves room for holdMax of them
// (see subscriberOf). A held ack lost with its channel only makes the
// broker deliver its message again, whose effect its processed mark
// skips. A nack goes out at once.
//
// One goroutine per channel (run) sends every frame, in order. The
// consumer's loop adds each delivery before handing it out, on the same
// channel of events as the settlements, so the acker learns of a
// delivery before its settlement.
type acker struct {
	ch     settler
	events chan ackEvent
	// holdMax is how many acks behind an unsettled delivery wait for a
	// multiple ack at most; 0 holds none. holdFor is how long one waits
	// at most.
	holdMax int
	holdFor time.Duration
	now     func() time.Time

	// Owned by run.
	pending []ackEntry // deliveries added and not yet behind a sent ack, in tag order
}

// ackEntry is a delivery handed out: settled once its fate is known, sent
// once a frame settled it at the broker.
type ackEntry struct {
	tag       uint64
	settled   bool
	sent      bool
	settledAt time.Time // when an ack came, while it is held
}

// ackHoldFor is how long an ack behind an unsettled delivery waits at
// most for a multiple ack (see acker): a few batches' commits.
const ackHoldFor = 10 * time.Millisecond

// newAcker returns the acker of ch, its events buffered up to capacity,
// holding up to holdMax acks behind an unsettled delivery.
func newAcker(ch settler, capacity, holdMax int) *acker {
	return &acker{ch: ch, events: make(chan ackEvent, capacity), holdMax: holdMax, holdFor: ackHoldFor, now: time.Now}
}

// add registers the delivery tag, before it is handed out.
func (a *acker) add(tag uint64) { a.events <- ackEvent{tag: tag, op: opAdd} }

// settle passes the fate of the delivery tag: acked, or nacked to be
// requeued. Each delivery settles once.
func (a *acker) settle(tag uint64, acked bool) {
	op := opNack
	if acked {
		op = opAck
	}
	a.events <- ackEvent{tag: tag, op: op}
}

// close ends run once it sent what it was given; call it once every
// delivery added is settled or abandoned.
func (a *acker) close() { close(a.events) }

// run sends the frames until close, and then the acks it held.
func (a *acker) run() {
	held := time.NewTimer(time.Hour)
	held.Stop()
	defer held.Stop()
	for {
		select {
		case ev, ok := <-a.events:
			if !a.applyWaiting(ev, ok) {
				a.flush(true)
				return
			}
		case <-held.C:
		}
		held.Stop()
		if due := a.flush(false); !due.IsZero() {
			held.Reset(due.Sub(a.now()))
		}
	}
}

// applyWaiting applies ev, received with ok, and every event that waits
// behind it; it reports false once close closed the events.
func (a *acker) applyWaiting(ev ackEvent, ok bool) bool {
	for ok {
		a.apply(ev)
		select {
		case ev, ok = <-a.events:
		default:
			return true
		}
	}
	return false
}

// apply records ev; a nack is sent at once.
func (a *acker) apply(ev ackEvent) {
	if ev.op == opAdd {
		a.pending = append(a.pending, ackEntry{tag: ev.tag})
		return
	}
	i := a.find(ev.tag)
	if i < 0 {
		// Never added: settle it alone.
		if ev.op == opAck {
			_ = a.ch.Ack(ev.tag, false)
		} else {
			_ = a.ch.Nack(ev.tag, false, true)
		}
		return
	}
	e := &a.pending[i]
	e.settled = true
	e.settledAt = a.now()
	if ev.op == opNack {
		_ = a.ch.Nack(ev.tag, false, true) // a lost channel fails it: the broker requeues the delivery
		e.sent = true
	}
}

// flush sends one multiple ack for the run of settled deliveries at the
// front. The acks behind an unsettled delivery it holds, while they are
// no more than holdMax and none waited holdFor, and returns when the
// oldest held one is due; otherwise, or with all, it sends each by
// itself, and returns zero.
func (a *acker) flush(all bool) (due time.Time) {
	n := 0
	var last uint64 // the highest tag of the run not yet acknowledged
	for n < len(a.pending) && a.pending[n].settled {
		if !a.pending[n].sent {
			last = a.pending[n].tag
		}
		n++
	}
	if last != 0 {
		_ = a.ch.Ack(last, true)
	}
	a.pending = a.pending[n:]
	held := 0
	var oldest time.Time
	for i := range a.pending {
		if e := &a.pending[i]; e.settled && !e.sent {
			held++
			if oldest.IsZero() || e.settledAt.Before(oldest) {
				oldest = e.settledAt
			}
		}
	}
	if held > 0 && !all && held <= a.holdMax && a.now().Sub(oldest) < a.holdFor {
		return oldest.Add(a.holdFor)
	}
	for i := range a.pending {
		if e := &a.pending[i]; e.settled && !e.sent {
			_ = a.ch.Ack(e.tag, false)
			e.sent = true
		}
	}
	if len(a.pending) == 0 {
		a.pending = nil // let the backing array go
	}
	return time.Time{}
}

// find returns the index of tag in pending, -1 if it is not there. Tags
// of one channel grow by one per delivery, so it is usually at tag minus
// the first one's.
func (a *acker) find(tag uint64) int {
	if len(a.pending) == 0 || tag < a.pending[0].tag {
		return -1
	}
	if i := tag - a.pending[0].tag; i < uint64(len(a.pending)) && a.pending[i].tag == tag {
		return int(i)
	}
	for i := range a.pending {
		if a.pending[i].tag == tag {
			return i
		}
	}
	return -1
}
