package testenv

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakWait is how long VerifyNoLeaks waits for goroutines to end after the
// tests passed.
const LeakWait = 10 * time.Second

// VerifyNoLeaks runs the tests of m, then fails the run when goroutines
// other than those opts ignore are still running LeakWait later, and exits.
// Use it in TestMain instead of goleak.VerifyTestMain, whose own retries
// last about 0.4 s: a connection a test closed last may take longer than
// that to wind down on a loaded machine (amqp091-go's reader ends when the
// broker has closed the socket), and that is not a leak. A goroutine that
// never ends still fails the run.
func VerifyNoLeaks(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(LeakWait)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: errors on a successful test run: %v\n", err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}
