package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/outage"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// state is what the steps of one message's chain learn about it, shared
// through the message context: the outer steps read what the inner ones
// found.
type state struct {
	envelope      *framework.Envelope // set once the CloudEvent decoded: &event.Envelope
	decoded       *decoded            // set once routed and its data decoded: &event
	event         decoded             // what envelope and decoded point to
	attempts      int
	deliveries    int  // the delivery guard's count of this delivery (1 for a known first delivery); 0 when not known
	counted       bool // the delivery guard counted this delivery in the store: the unit of work forgets the count
	gaveUp        bool // retry returned the error of its last attempt
	outcome       framework.Outcome
	deadLettered  framework.Code
	cause         error         // the error that got the message dead-lettered
	deadLetterKey framework.Key // the dead letter's key (a poison's too)
	// observer, set by observe with the message it observes, hears of
	// each failed attempt (see attemptFailed).
	observer *observer
	msg      *message.Message
	stale    bool              // the sequence guard skipped it
	parked   bool              // strict order parked it behind a dead letter
	release  []string          // subjects whose parked events its effect let through
	probe    uint64            // the number of the breaker's probe it is, or 0
	reported framework.Outcome // the outcome observe reported
	crash    crash.Hook        // the crash hook of the message's context, nil without one
	paused   string            // why its attempts paused last (see pauseFor), "" once one succeeded
}

// dies returns a *crash.Died when the message's crash hook makes it die
// at p (see package internal/crash), nil otherwise. The hook's context is
// ctx with the decoded event, once there is one.
func (s *state) dies(ctx context.Context, p crash.Point) error {
	if s.crash == nil {
		return nil
	}
	if s.decoded != nil {
		ctx = pipeline.With(ctx, s.decoded)
	}
	if !s.crash(ctx, p) {
		return nil
	}
	return &crash.Died{At: p}
}

// attemptFailed reports a failed attempt to observe, if it runs. While
// the message's attempts pause for an outage, one that failed alike is
// not logged again (see pause): it is tracked as failing only.
func (s *state) attemptFailed(ctx context.Context, err error) {
	if s.observer != nil && s.paused == PausedDatabaseFull && outage.Full(err) {
		s.observer.track.fail(s.msg, s)
		return
	}
	if s.observer != nil {
		s.observer.attemptFailed(ctx, s, err)
	}
}

// decoded is a message's event routed to its handler, on the message's
// context for the steps after decode.
type decoded = pipeline.Decoded[framework.Envelope]

// eventOf returns the event that the decode step put on ctx: every step
// after it starts here.
func eventOf(ctx context.Context) (*framework.Envelope, error) {
	d, ok := pipeline.From[*decoded](ctx)
	if !ok {
		return nil, errNotDecoded
	}
	return &d.Envelope, nil
}

// died reports whether err says that the delivery died at a crash point.
func died(err error) bool {
	_, ok := crash.PointOf(err)
	return ok
}

type stateKey struct{}

// stateOf returns the message's state, attaching a new one to its context
// when it has none.
func stateOf(msg *message.Message) *state {
	if s, ok := msg.Context().Value(stateKey{}).(*state); ok {
		return s
	}
	s := &state{crash: crash.HookOf(msg.Context())}
	msg.SetContext(context.WithValue(msg.Context(), stateKey{}, s))
	return s
}

// Report is what became of a message that went through a chain built with
// Handler, read back from the message (see ReportOf): for tests and
// tools that hand messages to the chain themselves.
type Report struct {
	// Outcome is one of framework.Processed, Duplicate, Stale, Parked,
	// DeadLettered and Nacked.
	Outcome framework.Outcome
	// Code is the dead letter's code; empty unless dead-lettered.
	Code framework.Code
	// Attempts is the number of attempts made.
	Attempts int
}

// ReportOf returns what became of msg once a chain built with Handler
// handled it; false when msg did not go through one.
func ReportOf(msg *message.Message) (Report, bool) {
	s, ok := msg.Context().Value(stateKey{}).(*state)
	if !ok || s.reported == "" {
		return Report{}, false
	}
	return Report{Outcome: s.reported, Code: s.deadLettered, Attempts: s.attempts}, true
}
