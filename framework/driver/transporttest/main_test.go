package transporttest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the suite's processes leave no goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
