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
// SkipStale) to its router handlers so that two events of one subject
// never run at once, and those of a subject run in the order their
// subscription delivered them. An event whose subject has an event in
// flight waits here, in memory, in its subject's line: it is not nacked,
// parked or counted, and it uses no attempt. Events of other subjects,
// and events without a subject, pass at once. Which goroutine the router
// starts first does not matter: an event reaches the router only once
// its predecessor of the subject returned from the chain.
//
// The waiting events stay handed out by the transport (unacknowledged), so
// they hold places of its window (the consumer's concurrency); an event
// in flight holds a single place of those that run, so a hot subject
// delays its own events, not the other subjects' that reached the
// consumer.
//
// Only the sequencer's own goroutine (forward) sends to the router: the
// end of an event's turn (done, in the router's handler) queues the next
// event of its subject and returns. A handler must never wait for the
// router's loop: watermill's Router.Close holds, until every running
// handler returned, the lock that loop takes to start a handler, so a
// handler waiting for the loop to take an event holds the close until its
// timeout.
type sequencer struct {
	maxBody int
	// settler is told the outcome of the waiting events the sequencer
	// nacks itself, when its subscription ends; nil when the subscriber
	// is no driver.Settler.
	settler driver.Settler

	mu sync.Mutex
	// lines holds, by subject, the events that wait for the subject's
	// event in flight, oldest first; a subject with an event in flight
	// has a line, empty when none waits.
	lines map[string][]waiting
	// subjects are the subjects of the events in flight, by message.
	subjects map[*message.Message]string
	// waitingNow counts the events in the lines.
	waitingNow int
}

// waiting is an event in its subject's line, and where it goes once its
// turn comes.
type waiting struct {
	msg *message.Message
	out *output
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
		settler:  settler,
		lines:    make(map[string][]waiting),
		subjects: make(map[*message.Message]string),
	}
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
func (s *sequencer) forward(in <-chan *message.Message, out *output) {
	for {
		if msg := s.nextReady(out); msg != nil {
			out.ch <- msg
			continue
		}
		select {
		case msg, ok := <-in:
			if !ok {
				s.end(out)
				close(out.ch)
				return
			}
			if s.admit(msg, out) {
				out.ch <- msg
			}
		case <-out.wake:
		}
	}
}

// nextReady takes the oldest event of out whose turn came; nil when
// none.
func (s *sequencer) nextReady(out *output) *message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(out.ready) == 0 {
		return nil
	}
	msg := out.ready[0]
	out.ready[0] = nil
	out.ready = out.ready[1:]
	return msg
}

// end nacks, once the subscription of out ended, the events waiting for
// out, and those whose turn came but never reached the router (freeing
// the turn of each for the event after it).
func (s *sequencer) end(out *output) {
	s.mu.Lock()
	out.done = true
	ready := out.ready
	out.ready = nil
	var stale []*message.Message
	for subject, line := range s.lines {
		kept := line[:0]
		for _, w := range line {
			if w.out == out {
				stale = append(stale, w.msg)
				delete(s.subjects, w.msg)
				s.waitingNow--
			} else {
				kept = append(kept, w)
			}
		}
		s.lines[subject] = kept
	}
	s.mu.Unlock()
	for _, msg := range stale {
		s.nack(msg)
	}
	for _, msg := range ready {
		s.done(msg)
		s.nack(msg)
	}
}

// admit reports whether msg, which reached the consumer, may go to the
// router now; otherwise it waits in its subject's line.
func (s *sequencer) admit(msg *message.Message, out *output) bool {
	subject := s.subjectOf(msg)
	if subject == "" {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subjects[msg] = subject
	line, busy := s.lines[subject]
	if !busy {
		s.lines[subject] = nil
		return true
	}
	s.lines[subject] = append(line, waiting{msg: msg, out: out})
	s.waitingNow++
	return false
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

// done is called once msg's chain returned (or msg was refused at the
// intake): the next event of its subject, if one waits, goes to the
// router, through forward. It never waits (see sequencer).
func (s *sequencer) done(msg *message.Message) {
	s.mu.Lock()
	subject, ok := s.subjects[msg]
	if !ok {
		s.mu.Unlock()
		return
	}
	delete(s.subjects, msg)
	line := s.lines[subject]
	if len(line) == 0 {
		delete(s.lines, subject)
		s.mu.Unlock()
		return
	}
	next := line[0]
	line[0] = waiting{}
	s.lines[subject] = line[1:]
	s.waitingNow--
	out := next.out
	if out.done {
		s.mu.Unlock()
		s.done(next.msg) // frees the turn for the one after it
		s.nack(next.msg)
		return
	}
	out.ready = append(out.ready, next.msg)
	s.mu.Unlock()
	select {
	case out.wake <- struct{}{}:
	default: // a signal is pending already
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
