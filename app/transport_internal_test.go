package app

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLeaseFor shows that the SQLite lease, renewed while a message is
// held, does not grow with the messages in flight nor the attempts: a
// crashed process's messages wait about one lease whatever the
// concurrency. The PostgreSQL ack deadline, not renewed, covers one
// message's attempts, and its transport has one message in flight per
// group whatever the concurrency.
func TestLeaseFor(t *testing.T) {
	t.Parallel()
	defaults := Config{}.Consumer("c")
	for _, concurrency := range []int{1, 16, 64} {
		cc := defaults
		cc.Concurrency = concurrency
		require.Equal(t, time.Minute, leaseFor(cc), "concurrency %d", concurrency)
		require.Equal(t, 3*31*time.Second*5/4+time.Second, ackDeadlineFor(cc), "concurrency %d", concurrency)
	}

	short := defaults
	short.Timeout = Duration(time.Second)
	require.Equal(t, 2*time.Second, leaseFor(short), "a renewal may wait for an attempt that runs to its timeout")
	short.Timeout = Duration(time.Millisecond)
	require.Equal(t, time.Second, leaseFor(short), "never below a second")
}
