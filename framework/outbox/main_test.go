package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every relay a test runs stops with its context.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
