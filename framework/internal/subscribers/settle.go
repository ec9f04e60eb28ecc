package subscribers

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// Watch waits until the router acks or nacks msg and tells s which, for
// a reader that does not report each message's outcome itself (see
// pipeline.SettleReported). When ctx (the subscription's) ends first it
// returns without telling: shutdown then reads the message's state
// itself. The SQL transports' subscriptions run it on a goroutine of its
// own for each message they hand out to such a reader.
func Watch(ctx context.Context, msg *message.Message, s pipeline.Settler) {
	select {
	case <-msg.Acked():
		s.Settled(true)
	case <-msg.Nacked():
		s.Settled(false)
	case <-ctx.Done():
	}
}
