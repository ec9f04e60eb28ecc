package driver

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"
)

// sharedPing runs one ping at a time: a call made while one is in flight
// waits for its answer instead of starting another. During a black hole
// each ping holds a connection of the pool until its deadline, and each
// message whose attempts pause pings every 250 ms: without sharing, a
// consumer's paused messages filled the pool with connections that
// stayed open, idle, long after the outage.
type sharedPing struct{ calls singleflight.Group }

// maxPing bounds a shared ping whose first caller set no deadline.
const maxPing = 5 * time.Second

// do returns the answer of the ping in flight, or of a new one that runs
// ping within ctx's deadline (maxPing without one), not its cancellation:
// others may wait for it. It returns ctx's error when ctx ends first.
func (s *sharedPing) do(ctx context.Context, ping func(context.Context) error) error {
	answer := s.calls.DoChan("ping", func() (any, error) {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(maxPing)
		}
		pctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		return nil, ping(pctx)
	})
	select {
	case r := <-answer:
		if r.Err != nil {
			return fmt.Errorf("ping the database: %w", r.Err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ping the database: %w", context.Cause(ctx))
	}
}
