// Package replay holds the loop every transport's Replay runs: publish each
// message, one at a time, as a copy that carries the caller's context.
package replay

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Publish hands a copy of each of msgs, in order, to publish, with ctx set
// as the copy's context, so that the caller's messages are left as they
// were and the publisher sees the caller's deadline and values. It stops at
// the first error and returns it unwrapped: the caller says what failed.
func Publish(ctx context.Context, publish func(*message.Message) error, msgs ...*message.Message) error {
	for _, msg := range msgs {
		m := msg.Copy()
		m.SetContext(ctx)
		if err := publish(m); err != nil {
			return err
		}
	}
	return nil
}
