package console_test

import (
	"testing"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that the tests' servers and databases leave no
// goroutine behind.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m)
}
