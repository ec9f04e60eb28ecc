package amqp

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaks a goroutine: every Connection,
// Publisher and Subscriber a test opens must be closed by its end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
