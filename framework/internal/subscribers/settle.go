package subscribers

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Settled is a message a subscription handed out, told its outcome once.
type Settled interface {
	// Settled says the message was acked (true) or nacked (false).
	Settled(acked bool)
}

// Watch waits until the router acks or nacks msg and tells s which, for
// a reader that does not settle each message itself (see
// driver.SubscribeConfig.Settles). When ctx (the subscription's) ends
// first it returns without telling: shutdown then reads the message's
// state itself. The SQL transports' subscriptions run it on a goroutine
// of its own for each message they hand out to such a reader.
func Watch(ctx context.Context, msg *message.Message, s Settled) {
	select {
	case <-msg.Acked():
		s.Settled(true)
	case <-msg.Nacked():
		s.Settled(false)
	case <-ctx.Done():
	}
}
