package driver

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// sharedPing runs one ping at a time: a call made while one is in flight
// waits for its answer instead of starting another. During a black hole
// each ping holds a connection of the pool until its deadline, and each
// message whose attempts pause pings every 250 ms: without sharing, a
// consumer's paused messages filled the pool with connections that
// stayed open, idle, long after the outage.
type sharedPing struct {
	mu       sync.Mutex
	inFlight *pingCall
}

// maxPing bounds a shared ping whose first caller set no deadline.
const maxPing = 5 * time.Second

// pingCall is a ping in flight: err is set before done closes.
type pingCall struct {
	done chan struct{}
	err  error
}

// do returns the answer of the ping in flight, or of a new one that runs
// ping within ctx's deadline (maxPing without one), not its cancellation:
// others may wait for it. It returns ctx's error when ctx ends first.
func (s *sharedPing) do(ctx context.Context, ping func(context.Context) error) error {
	s.mu.Lock()
	c := s.inFlight
	if c == nil {
		c = &pingCall{done: make(chan struct{})}
		s.inFlight = c
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(maxPing)
		}
		pctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		go func() {
			defer cancel()
			if err := ping(pctx); err != nil {
				c.err = fmt.Errorf("ping the database: %w", err)
			}
			s.mu.Lock()
			s.inFlight = nil
			s.mu.Unlock()
			close(c.done)
		}()
	}
	s.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("ping the database: %w", context.Cause(ctx))
	}
}
