package apptest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every application is stopped and every database closed at cleanup, so
// nothing is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
