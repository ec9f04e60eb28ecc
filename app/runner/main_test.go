package runner_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that the runners and transports of the tests leave no
// goroutine behind.
//
// One leak is watermill's, not ours: when a handler's Subscribe fails, Run
// returns, but the router's watcher goroutine waits forever for that
// handler, counted since AddHandler and never started
// (TestUntilRunning/NackedWhenNeverRunning). The others are
// watermill-amqp's, as in framework/amqp's TestMain: a connection the
// broker drops while it closes (TestAMQPBrokerRestart) blocks amqp091-go's
// shutdown on an unread channel, and with it that connection's reader and
// heartbeater.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/message.(*Router).watchAllHandlersStopped.func1"),
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp.(*ConnectionWrapper).handleConnectionClose"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).reader"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).heartbeater"),
	)
}
