// Package nackdelay puts a pause between a nack and the redelivery it asks
// for, for transports that redeliver a nacked message at once
// (watermill-amqp requeues it, GoChannel sends it again): without it a
// message that keeps failing loops hot.
package nackdelay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Backoff is the pause after a nack: First, growing while a subscription
// nacks without an ack, up to Max (see Streak).
type Backoff struct {
	First time.Duration
	Max   time.Duration
}

// Streak paces the nacks of one subscription. The pause after a nack is
// Backoff.First plus the time since the first nack that followed the last
// ack, up to Backoff.Max. A message nacked on every delivery, alone, waits
// First, then twice, four times as long, and so does every message in
// flight while nothing is acked (the database is down): the pauses
// double. But messages in flight together and nacked at about the same
// time while others are acked (events waiting for an earlier one under
// strict order) each wait First: counting each of them as one more
// consecutive nack would send most of them to the longest pause at once,
// holding their slots of the consumer's concurrency as long, and starve
// the events they wait for. The zero Streak is ready; it is safe for
// concurrent use.
type Streak struct {
	mu    sync.Mutex
	since time.Time // the first nack after the last ack; zero after an ack
}

// Acked ends the streak.
func (s *Streak) Acked() {
	s.mu.Lock()
	s.since = time.Time{}
	s.mu.Unlock()
}

// Nacked records a nack at now and returns its pause by b.
func (s *Streak) Nacked(now time.Time, b Backoff) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		s.since = now
	}
	return min(b.First+now.Sub(s.since), b.Max)
}

// ErrClosed is returned by Forwarder.Forward after Close.
var ErrClosed = errors.New("closed")

// Forwarder forwards the subscriptions of one subscriber, each through
// forward, and ends them together. The subscriber closes in three steps:
// Close (the pauses end, so nacked messages go back at once), then its
// transport's subscriptions (so their channels close), then Wait.
type Forwarder struct {
	backoff Backoff

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup
}

// NewForwarder returns a Forwarder that pauses by b.
func NewForwarder(b Backoff) *Forwarder {
	return &Forwarder{backoff: b, closing: make(chan struct{})}
}

// Forward returns the copies of the messages of in, a subscription of
// the transport, and settles each original once its copy is settled: an
// ack at once, a nack after the backoff's pause. The channel closes when
// in closes. After Close it returns ErrClosed.
func (f *Forwarder) Forward(ctx context.Context, in <-chan *message.Message) (<-chan *message.Message, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	out := make(chan *message.Message)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(out)
		forward(ctx, in, out, f.closing, f.backoff)
	}()
	return out, nil
}

// Close ends the pauses: from now on a nack, or a message not yet handed
// out, goes back to the transport at once. It reports whether this call
// closed the Forwarder (false: it was closed already).
func (f *Forwarder) Close() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.closed = true
	close(f.closing)
	return true
}

// Closed reports whether Close was called.
func (f *Forwarder) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Wait waits until every forward has returned, that is until the
// transport closed every subscription's channel.
func (f *Forwarder) Wait() { f.wg.Wait() }

// forward hands each message of in to out as a copy, with the original's
// context, and settles the original once the copy is settled: an ack at
// once, a nack after the backoff's pause. It returns when in closes.
//
// When closing closes or ctx ends, a message not yet handed out, or
// nacked and pausing, is nacked at once: the transport takes it back
// while it closes. A message whose context ends (its subscription
// stopped) is nacked too.
func forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message, closing <-chan struct{}, b Backoff) {
	var nacks Streak
	for orig := range in {
		msg := orig.Copy()
		msg.SetContext(orig.Context())
		select {
		case out <- msg:
		case <-closing:
			orig.Nack()
			continue // in closes soon
		case <-ctx.Done():
			orig.Nack()
			continue
		}
		select {
		case <-msg.Acked():
			nacks.Acked()
			orig.Ack()
		case <-msg.Nacked():
			t := time.NewTimer(nacks.Nacked(time.Now(), b))
			select {
			case <-t.C:
			case <-closing:
			case <-ctx.Done():
			}
			t.Stop()
			orig.Nack()
		case <-orig.Context().Done():
			orig.Nack()
		}
	}
}
