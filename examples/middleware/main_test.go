package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests close their applications, so nothing is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
