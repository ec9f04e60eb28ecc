package cli_test

import (
	"testing"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that the tests' databases leave no goroutine behind.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m)
}
