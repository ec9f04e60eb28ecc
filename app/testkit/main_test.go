package testkit_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every kit closes its pools at cleanup, so nothing is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
