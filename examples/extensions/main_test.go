package extensions_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The Example closes its application, so nothing is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
