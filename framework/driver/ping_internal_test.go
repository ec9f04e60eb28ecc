package driver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSharedPing: calls made while a ping is in flight share its answer;
// the next call after it pings again; a caller whose context ends stops
// waiting, and the ping it started still answers the others.
//
// It runs in a synctest bubble: synctest.Wait returns once every caller
// waits on the ping in flight, where a sleep left callers that started
// late to ping again on a loaded machine.
func TestSharedPing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testSharedPing)
}

func testSharedPing(t *testing.T) {
	var (
		s       sharedPing
		pings   atomic.Int32
		release = make(chan struct{})
		down    = errors.New("no route to host")
	)
	ping := func(ctx context.Context) error {
		pings.Add(1)
		select {
		case <-release:
			return down
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	early, stop := context.WithCancel(ctx)
	earlyErr := make(chan error, 1)
	go func() { earlyErr <- s.do(early, ping) }()
	synctest.Wait()
	require.EqualValues(t, 1, pings.Load(), "the first caller's ping is in flight")
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = s.do(ctx, ping) })
	}
	synctest.Wait() // every caller waits on the ping in flight
	stop()          // the first caller gives up; its ping goes on for the others
	require.ErrorIs(t, <-earlyErr, context.Canceled)
	close(release)
	wg.Wait()
	for _, err := range errs {
		require.ErrorIs(t, err, down)
	}
	require.EqualValues(t, 1, pings.Load(), "one ping for nine callers")

	require.ErrorIs(t, s.do(ctx, ping), down)
	require.EqualValues(t, 2, pings.Load(), "a call after the answer pings again")
}
