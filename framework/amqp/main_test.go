package amqp

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that no test leaks a goroutine: every Connection,
// Publisher and Subscriber a test opens must be closed by its end.
//
// One leak is watermill-amqp's, not ours, and only when a broker goes away
// (TestBrokerRestart): its ConnectionWrapper registers an unbuffered
// NotifyClose channel and stops reading it once closed, so when the broker
// drops a connection that is being closed, amqp091-go's shutdown blocks on
// that send forever (and a second goroutine on its lock). And when a
// connection is closed while the broker is down (DownAtBoot), its
// handleConnectionClose goroutine waits for a reconnection that never
// comes: it selects on closing only after it was connected. And when a
// close notification races closing in that select, it may reconnect after
// Close, and watermill-amqp never closes that connection: our Close closes
// its socket (brokers.close), but amqp091-go's reader and heartbeater may
// then block in its shutdown as above: seen in loaded full runs. A
// transport a test forgets to close still shows by its subscriptions'
// goroutines, which are ours.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp.(*ConnectionWrapper).handleConnectionClose"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).reader"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).heartbeater"),
	)
}
