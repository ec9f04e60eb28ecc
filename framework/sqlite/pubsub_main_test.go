package sqlite

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test of the package leaks a goroutine: every
// Subscriber, Publisher and database a test opens must be closed by its
// end. It is the package's only TestMain.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
