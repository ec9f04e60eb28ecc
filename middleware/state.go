package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// state is what the steps of one message's chain learn about it, shared
// through the message context: the outer steps read what the inner ones
// found.
type state struct {
	envelope     *framework.Envelope // set once the CloudEvent decoded
	decoded      *framework.Decoded  // set once routed and its data decoded
	attempts     int
	outcome      framework.Outcome
	deadLettered framework.Code
	stale        bool // the sequence guard skipped it
}

type stateKey struct{}

// stateOf returns the message's state, attaching a new one to its context
// when it has none.
func stateOf(msg *message.Message) *state {
	if s, ok := msg.Context().Value(stateKey{}).(*state); ok {
		return s
	}
	s := &state{}
	msg.SetContext(context.WithValue(msg.Context(), stateKey{}, s))
	return s
}
