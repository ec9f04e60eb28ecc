package amqp

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
// ones handed out (the oldest) with one multiple ack. An ack behind a
// delivery still unsettled is sent by itself at once, never held back:
// held, it would stay unacknowledged at the broker, where it counts
// against the channel's prefetch. A multiple ack acknowledges every
// unacknowledged tag up to its own, so it is only sent when each of them
// is settled; its own tag must still be unacknowledged (RabbitMQ closes
// the channel on an unknown tag), and each tag is settled once.
//
// One goroutine per channel (run) sends every frame, in order. The
// consumer's loop adds each delivery before handing it out, on the same
// channel of events as the settlements, so the acker learns of a
// delivery before its settlement.
type acker struct {
	ch     settler
	events chan ackEvent

	// Owned by run.
	pending []ackEntry // deliveries added and not yet behind a sent ack, in tag order
}

// ackEntry is a delivery handed out: settled once its fate is known, sent
// once a frame settled it at the broker.
type ackEntry struct {
	tag     uint64
	settled bool
	sent    bool
}

// newAcker returns the acker of ch, its events buffered up to capacity.
func newAcker(ch settler, capacity int) *acker {
	return &acker{ch: ch, events: make(chan ackEvent, capacity)}
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

// run sends the frames until close.
func (a *acker) run() {
	for ev := range a.events {
		a.apply(ev)
	drain:
		for {
			select {
			case ev, ok := <-a.events:
				if !ok {
					break drain
				}
				a.apply(ev)
			default:
				break drain
			}
		}
		a.flush()
	}
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
	if ev.op == opNack {
		_ = a.ch.Nack(ev.tag, false, true) // a lost channel fails it: the broker requeues the delivery
		e.sent = true
	}
}

// flush sends one multiple ack for the run of settled deliveries at the
// front, and acks each other settled delivery by itself.
func (a *acker) flush() {
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
	for i := range a.pending {
		if e := &a.pending[i]; e.settled && !e.sent {
			_ = a.ch.Ack(e.tag, false)
			e.sent = true
		}
	}
	if len(a.pending) == 0 {
		a.pending = nil // let the backing array go
	}
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
