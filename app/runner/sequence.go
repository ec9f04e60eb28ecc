package runner

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// sequencer hands the messages of an ordered consumer (StrictOrder or
// SkipStale) to its router handlers so that the events of a subject take
// effect in the order their subscription delivered them. An event whose
// subject has an event ahead of it waits here, in memory, in its
// subject's line: it is not nacked, parked or counted, and it uses no
// attempt. Events of other subjects, and events without a subject, pass
// at once.
//
// An event goes to the router once the event ahead of it returned from
// the chain, or, sooner, once an attempt of that one joined the queue of
// the unit of work's batches (pipeline.Turn.Joined: strict order on a
// database with group commit): the unit of work then runs the later one
// behind it, in the same batch's transaction or a later batch, and fails
// it unrun (pipeline.ErrTurn) when the one ahead failed; the intake then
// runs its chain again once the one ahead returned. So a hot subject's
// events share batches instead of taking one batch each.
//
// The waiting events stay handed out by the transport (unacknowledged).
// Of a subject's events in the consumer, waiting here or on their way
// (in the unit of work's queue behind the one ahead), up to share hold
// places of the transport's window (the consumer's concurrency); those
// behind them are held out of it when the subscriber lets them
// (driver.Holder), so that a hot subject leaves the window's other places
// to the other subjects' events, which keep coming. A hot subject delays
// its own events only, until the subscription holds as many as it may
// (driver.SubscribeConfig.Hold): from then on its events hold places
// again, and once they fill the window the consumer takes nothing more
// until they go (bounded memory first).
//
// Only the sequencer's own goroutine (forward) sends to the router: the
// end of an event's turn (done, in the router's handler) and its joining
// the unit of work's queue (joined) queue the next event of its subject
// and return. A handler must never wait for the router's loop: watermill's
// Router.Close holds, until every running handler returned, the lock that
// loop takes to start a handler, so a handler waiting for the loop to take
// an event holds the close until its timeout.
type sequencer struct {
	maxBody int
	// share is how many places of the window a subject's events hold at
	// most while holder takes the others (see place).
	share int
	// holder keeps events waiting out of the window; nil when the
	// subscriber is no driver.Holder.
	holder driver.Holder
	// settler is told the outcome of the waiting events the sequencer
	// nacks itself, when its subscription ends; nil when the subscriber
	// is no driver.Settler.
	settler driver.Settler
	// handBack records the events that wait when the service stops:
	// none of them is handled from then on (the intake refuses them),
	// and a refusal or a nack at the subscription's end may come too
	// late to record them (the subscription settles what is left once
	// the router closes). Nil records nothing.
	handBack *handBack
	// stopping is closed when the service begins to stop, closing when
	// Stop gives up waiting for the attempts in flight and closes the
	// router (see forward); nil never are.
	stopping, closing <-chan struct{}

	mu sync.Mutex
	// lines holds the subjects with an event in flight or waiting.
	lines map[string]*line
	// inFlight are the events let go to the router, whose chain has not
	// returned for good.
	inFlight map[*message.Message]flight
	// waitingNow counts the events in the lines.
	waitingNow int
	// placed counts, by subject, the events waiting or in flight that
	// hold places of the window (not held: see place).
	placed map[string]int
}

// line is a subject's events in the process.
type line struct {
	// last is the turn of the subject's event let go last, while its
	// chain runs; nil when none does.
	last *pipeline.Turn
	// open says that last joined the unit of work's queue: the next
	// event may go.
	open bool
	// waiting are the events not let go yet, oldest first.
	waiting []waiting
}

// flight is an event let go to the router: its subject and its turn.
type flight struct {
	subject string
	turn    *pipeline.Turn
	held    bool // out of the window (see sequencer.place)
}

// waiting is an event in its subject's line, and where it goes once its
// turn comes.
type waiting struct {
	msg *message.Message
	out *output
	// held says that msg waits out of the window (driver.Holder).
	held bool
}

// output is the channel of one of the consumer's router handlers.
type output struct {
	ch chan *message.Message
	// ready holds the events whose turn came, oldest first, for forward
	// to send to ch; under the sequencer's mu.
	ready []*message.Message
	// wake tells forward that ready has events; it holds one signal.
	wake chan struct{}
	// done is set, under the sequencer's mu, once the subscription's
	// channel closed: what would go to ready is nacked instead.
	done bool
}

func newSequencer(maxBody int, settler driver.Settler) *sequencer {
	return &sequencer{
		maxBody:  maxBody,
		share:    1,
		settler:  settler,
		lines:    make(map[string]*line),
		inFlight: make(map[*message.Message]flight),
		placed:   make(map[string]int),
	}
}

// holdBeyond makes s hold out of the window, through holder, a
// subject's waiting events beyond its share of a window of concurrency
// places: a quarter (at least one).
func (s *sequencer) holdBeyond(concurrency int, holder driver.Holder) {
	s.share, s.holder = max(1, concurrency/4), holder
}

// subscriber returns sub whose subscriptions pass through s.
func (s *sequencer) subscriber(sub message.Subscriber) message.Subscriber {
	return &sequencedSubscriber{Subscriber: sub, seq: s}
}

// sequencedSubscriber is a subscriber whose messages pass through a
// sequencer on their way to the router.
type sequencedSubscriber struct {
	message.Subscriber
	seq *sequencer
}

// Subscribe subscribes to topic and returns a channel of its messages in
// the order of their subjects' turns.
func (s *sequencedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := &output{ch: make(chan *message.Message), wake: make(chan struct{}, 1)}
	go s.seq.forward(in, out)
	return out.ch, nil
}

// forward passes the messages of in to out as their turns come, those
// whose turn came (ready) first, and once in closes, nacks the events
// still waiting for out and closes out.
//
// Once the service begins to stop (stopping), it hands no further event
// to the router, whose intake would refuse it: each event that comes
// waits in its subject's line, and so do those waiting and those whose
// turn came, and each is recorded as handed back unhandled (see
// handBack). Once Stop gives up waiting (closing), it nacks them, and
// each event that comes from then on at once: the router, as it closes,
// waits for its running handlers before it reads another message, so an
// event handed to it then would wait for them, and the subscription for
// its settling.
func (s *sequencer) forward(in <-chan *message.Message, out *output) {
	stopping, closing := s.stopping, s.closing
	for {
		var (
			send chan<- *message.Message
			next *message.Message
		)
		if !closed(s.stopping) {
			if next = s.firstReady(out); next != nil {
				send = out.ch
			}
		}
		select {
		case send <- next:
			s.dropReady(out)
		case msg, ok := <-in:
			if !ok {
				s.end(out)
				close(out.ch)
				return
			}
			s.arrived(msg, out)
		case <-out.wake:
		case <-stopping:
			stopping = nil
			s.handBack.records(s.stalled(out, false))
		case <-closing:
			closing = nil
			back := s.stalled(out, true)
			s.handBack.records(back) // again, if stopping came along
			for _, msg := range back {
				s.refuse(msg)
			}
		}
	}
}

// arrived admits msg, which reached the consumer: it goes to out's ready
// events, or waits in its subject's line; once the service stops it is
// handed back (see forward).
func (s *sequencer) arrived(msg *message.Message, out *output) {
	switch {
	case closed(s.closing):
		s.handBack.record(msg)
		s.nack(msg)
	case s.admit(msg, out):
		s.mu.Lock()
		out.ready = append(out.ready, msg)
		s.mu.Unlock()
	case closed(s.stopping):
		s.handBack.record(msg)
	}
}

// firstReady is the oldest event of out whose turn came; nil when none.
func (s *sequencer) firstReady(out *output) *message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(out.ready) == 0 {
		return nil
	}
	return out.ready[0]
}

// dropReady forgets the oldest event of out whose turn came, sent.
func (s *sequencer) dropReady(out *output) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out.ready[0] = nil
	out.ready = out.ready[1:]
}

// stalled returns the events of out held back by the stop: those that
// wait in their subjects' lines and those whose turn came; with remove
// it takes them out of the lines and the ready events, and a
// caller refuses them (see refuse: that frees their turns).
func (s *sequencer) stalled(out *output, remove bool) []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	msgs := append([]*message.Message(nil), out.ready...)
	if remove {
		out.ready = nil
	}
	return append(msgs, s.waitingFor(out, remove)...)
}

// end nacks, once the subscription of out ended, the events waiting for
// out, and those whose turn came but never reached the router (freeing
// the turn of each for the event after it).
func (s *sequencer) end(out *output) {
	s.mu.Lock()
	out.done = true
	ready := out.ready
	out.ready = nil
	stale := s.waitingFor(out, true)
	s.mu.Unlock()
	for _, msg := range stale {
		s.nack(msg)
	}
	for _, msg := range ready {
		s.refuse(msg)
	}
}

// waitingFor returns the events that wait for out in their subjects'
// lines, oldest first in each; with remove it takes them out, and
// forgets the lines left with no event. Call it with s.mu held.
func (s *sequencer) waitingFor(out *output, remove bool) []*message.Message {
	var msgs []*message.Message
	for subject, l := range s.lines {
		kept := l.waiting[:0]
		for _, w := range l.waiting {
			switch {
			case w.out != out:
				kept = append(kept, w)
			case remove:
				msgs = append(msgs, w.msg)
				s.waitingNow--
				if !w.held {
					s.unplace(subject)
				}
			default:
				msgs = append(msgs, w.msg)
				kept = append(kept, w)
			}
		}
		clear(l.waiting[len(kept):])
		l.waiting = kept
		if l.last == nil && len(kept) == 0 {
			delete(s.lines, subject)
		}
	}
	return msgs
}

// admit reports whether msg, which reached the consumer, may go to the
// router now; otherwise it waits in its subject's line.
func (s *sequencer) admit(msg *message.Message, out *output) bool {
	subject := s.subjectOf(msg)
	stopping := closed(s.stopping) // every event waits: see forward
	if subject == "" && !stopping {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lines[subject]
	if l == nil {
		l = &line{}
		s.lines[subject] = l
	}
	if stopping || l.last != nil && (!l.open || len(l.waiting) > 0) {
		l.waiting = append(l.waiting, waiting{msg: msg, out: out, held: s.place(subject, msg)})
		s.waitingNow++
		return false
	}
	s.letGo(subject, l, msg, s.place(subject, msg))
	return true
}

// place reports whether msg, an event of subject that reached the
// consumer, is held out of the window (see holder): when the subject's
// events hold their share of its places already, and the holder takes
// it. Otherwise msg holds a place. Call it with s.mu held.
func (s *sequencer) place(subject string, msg *message.Message) (held bool) {
	if s.placed[subject] >= s.share && s.holder != nil && s.holder.Hold(msg) {
		return true
	}
	s.placed[subject]++
	return false
}

// unplace frees the place of an event of subject. Call it with s.mu
// held.
func (s *sequencer) unplace(subject string) {
	if s.placed[subject]--; s.placed[subject] <= 0 {
		delete(s.placed, subject)
	}
}

// letGo makes msg the event of subject, whose line is l, let go last,
// behind the one before, if any still runs; held says that msg holds no
// place of the window. Call it with s.mu held.
func (s *sequencer) letGo(subject string, l *line, msg *message.Message, held bool) {
	t := pipeline.NewTurn(l.last, nil)
	t.Joined = func() { s.joined(subject, t) }
	l.last, l.open = t, false
	s.inFlight[msg] = flight{subject: subject, turn: t, held: held}
	msg.SetContext(pipeline.With(msg.Context(), t))
}

// next lets the first event waiting in l go, when one waits, and returns
// it with the output it goes to. Call it with s.mu held.
func (s *sequencer) next(subject string, l *line) (waiting, bool) {
	if len(l.waiting) == 0 {
		return waiting{}, false
	}
	w := l.waiting[0]
	l.waiting[0] = waiting{}
	l.waiting = l.waiting[1:]
	s.waitingNow--
	s.letGo(subject, l, w.msg, w.held)
	return w, true
}

// subjectOf is the CloudEvent subject of msg; empty when it has none, or
// when msg does not decode (the chain dead-letters it). A message that
// decodes carries its envelope on to the chain (pipeline.Read), which
// then does not decode its body again.
func (s *sequencer) subjectOf(msg *message.Message) string {
	env, err := driver.DecodeMessage(msg, s.maxBody)
	if err != nil {
		return ""
	}
	msg.SetContext(pipeline.With(msg.Context(), &pipeline.Read[framework.Envelope]{Envelope: env}))
	return env.Subject
}

// joined is called once an attempt of the event of turn t, of subject,
// joined the unit of work's queue: the next event of the subject, if one
// waits, goes to the router, through forward (the unit of work must not
// wait).
func (s *sequencer) joined(subject string, t *pipeline.Turn) {
	s.mu.Lock()
	l := s.lines[subject]
	if l == nil || l.last != t || l.open {
		s.mu.Unlock()
		return
	}
	l.open = true
	s.passOn(subject, l)
}

// done is called once msg's chain returned for good (or msg was refused
// at the intake): the events behind it that lost their turn may run
// again, and when no event of its subject went after it, the next one,
// if one waits, goes to the router.
func (s *sequencer) done(msg *message.Message) {
	s.mu.Lock()
	f, ok := s.inFlight[msg]
	if !ok {
		s.mu.Unlock()
		return
	}
	delete(s.inFlight, msg)
	if !f.held {
		s.unplace(f.subject)
	}
	f.turn.Ahead = nil // the turns of a subject never chain up in memory
	f.turn.Done()
	l := s.lines[f.subject]
	if l == nil || l.last != f.turn {
		s.mu.Unlock() // a later event went: its own turn lets the next go
		return
	}
	l.last, l.open = nil, false
	if len(l.waiting) == 0 {
		delete(s.lines, f.subject)
	}
	s.passOn(f.subject, l)
}

// passOn lets the first event waiting in l, the line of subject, go,
// when one waits: it joins its output's ready events, for forward. It
// never waits (see sequencer). Call it with s.mu held; it lets go of it.
func (s *sequencer) passOn(subject string, l *line) {
	if closed(s.stopping) {
		s.mu.Unlock() // the next waits, handed back with the others (see forward)
		return
	}
	w, ok := s.next(subject, l)
	if !ok {
		s.mu.Unlock()
		return
	}
	if w.out.done {
		s.mu.Unlock()
		s.refuse(w.msg)
		return
	}
	w.out.ready = append(w.out.ready, w.msg)
	s.mu.Unlock()
	select {
	case w.out.wake <- struct{}{}:
	default: // a signal is pending already
	}
}

// refuse nacks msg, let go to a subscription that ended, and frees its
// turn for the one after it.
func (s *sequencer) refuse(msg *message.Message) {
	s.done(msg)
	s.nack(msg)
}

// inTurn runs h, the chain of an ordered consumer, on msg, and again each
// time an attempt of msg lost its turn (pipeline.ErrTurn: the attempt of
// the event ahead of it in its subject's line failed): once the chain of
// that event returned, from msg's context as it came, with no event ahead.
// The middleware around the chain sees none of it.
func inTurn(h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		orig := msg.Context()
		for {
			err := h(msg)
			if !pipeline.LostTurn(err) {
				return err
			}
			t, ok := pipeline.From[*pipeline.Turn](orig)
			if !ok || t.Ahead == nil {
				return err // not the sequencer's: nacked, delivered again
			}
			select {
			case <-t.Ahead.Ended():
			case <-orig.Done():
				return err
			}
			t.Ahead = nil
			msg.SetContext(orig)
		}
	}
}

// nack nacks msg, which never reached the router, and tells the
// subscriber so.
func (s *sequencer) nack(msg *message.Message) {
	msg.Nack()
	if s.settler != nil {
		s.settler.Settle(msg, false)
	}
}

// waitingEvents is how many events wait for their turn.
func (s *sequencer) waitingEvents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitingNow
}
