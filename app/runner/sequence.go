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
type sequencer struct {
	maxBody int
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
	// closed is closed once the subscription's channel is: what would go
	// to ch is nacked instead.
	closed chan struct{}
	// sends counts the sends to ch in progress, so that ch closes after
	// them.
	sends sync.WaitGroup
	done  bool // under the sequencer's mu: closed is closed
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
	out := &output{ch: make(chan *message.Message), closed: make(chan struct{})}
	go s.seq.forward(in, out)
	return out.ch, nil
}

// forward passes the messages of in to out as their turns come, and once
// in closes, nacks the events still waiting for out and closes out.
//
// Once the service begins to stop (stopping), it hands no further event
// to the router, whose intake would refuse it: each event that comes
// waits in its subject's line, and so do those waiting, and each is
// recorded as handed back unhandled (see handBack). Once Stop gives up
// waiting (closing), it nacks them, and each event that comes from then
// on at once: the router, as it closes, waits for its running handlers
// before it reads another message, so an event handed to it then would
// wait for them, and the subscription for its settling.
func (s *sequencer) forward(in <-chan *message.Message, out *output) {
	stopping, closing := s.stopping, s.closing
	for {
		var (
			msg *message.Message
			ok  bool
		)
		select {
		case msg, ok = <-in:
		case <-stopping:
			stopping = nil
			s.handBack.records(s.waitingFor(out, false))
			continue
		case <-closing:
			closing = nil
			back := s.waitingFor(out, true)
			s.handBack.records(back) // again, if stopping came along
			for _, msg := range back {
				s.nack(msg)
			}
			continue
		}
		if !ok {
			break
		}
		switch {
		case closed(s.closing):
			s.handBack.record(msg)
			s.nack(msg)
		case s.admit(msg, out):
			out.ch <- msg
		case closed(s.stopping):
			s.handBack.record(msg)
		}
	}
	s.mu.Lock()
	out.done = true
	close(out.closed)
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
	out.sends.Wait()
	close(out.ch)
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
	s.subjects[msg] = subject
	line, busy := s.lines[subject]
	if !busy && !stopping {
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
// router.
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
	if closed(s.stopping) {
		// The next waits, handed back with the others (see forward).
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
	out.sends.Add(1)
	s.mu.Unlock()
	defer out.sends.Done()
	select {
	case out.ch <- next.msg:
	case <-out.closed:
		s.done(next.msg)
		s.nack(next.msg)
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

// waitingFor returns the events that wait for their turn to go to out,
// and with remove takes them out of their lines.
func (s *sequencer) waitingFor(out *output, remove bool) []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var msgs []*message.Message
	for subject, line := range s.lines {
		kept := line[:0]
		for _, w := range line {
			switch {
			case w.out != out:
				kept = append(kept, w)
			case remove:
				msgs = append(msgs, w.msg)
				delete(s.subjects, w.msg)
				s.waitingNow--
			default:
				msgs = append(msgs, w.msg)
				kept = append(kept, w)
			}
		}
		s.lines[subject] = kept
	}
	return msgs
}

// waitingEvents is how many events wait for their turn.
func (s *sequencer) waitingEvents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitingNow
}
