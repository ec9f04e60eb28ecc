package runner_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that the runners and transports of the tests leave no
// goroutine behind. The ignored ones are watermill-amqp's, as in
// framework/amqp's TestMain.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp.(*ConnectionWrapper).handleConnectionClose"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown"),
	)
}
