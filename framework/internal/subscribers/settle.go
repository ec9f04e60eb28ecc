package subscribers

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Settled waits until the router acks or nacks msg, or ctx (the
// subscription's) ends: acked says which, and ok is false when ctx ended
// first (shutdown then reads the message's state itself). The SQL
// transports' subscribers watch each message they hand out with it.
func Settled(ctx context.Context, msg *message.Message) (acked, ok bool) {
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-ctx.Done():
		return false, false
	}
}
