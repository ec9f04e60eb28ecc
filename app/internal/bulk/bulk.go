// Package bulk holds what the command line's replay and the operator
// console's bulk jobs share: the checks of a rate and of a time range,
// and the throttle that spaces the dead letters they handle.
package bulk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/effectively-once/effectively/middleware"
)

// CheckRate refuses a rate of dead letters a second that is negative,
// NaN, or positive below middleware.MinRateLimit, one an hour, the bound
// of a consumer's rate_limit too: a slower one waited longer than anyone
// runs a command between two replays (1e-9 is one every 31 years); 0
// means no limit.
func CheckRate(perSecond float64) error {
	switch {
	case !(perSecond >= 0): // NaN too
		return fmt.Errorf("want a positive number of dead letters a second (0: no limit), got %v", perSecond)
	case perSecond > 0 && perSecond < middleware.MinRateLimit:
		return fmt.Errorf("want at least %v dead letters a second (one an hour; 0: no limit), got %v: it would wait between two for longer", middleware.MinRateLimit, perSecond)
	}
	return nil
}

// ParseTime reads a time bound: RFC 3339, or a date (midnight UTC); ""
// is no bound (the zero time).
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if t, err = time.Parse(time.DateOnly, s); err != nil {
			return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-01-02T15:04:05Z) or a date (2026-01-02), got %q", s)
		}
	}
	if t.IsZero() {
		// 0001-01-01, the zero time, which a filter reads as no bound: the
		// next nanosecond selects what it says.
		t = t.Add(time.Nanosecond)
	}
	return t, nil
}

// CheckWindow refuses a range of first failures, at or after since and
// before until, that holds nothing; a zero bound is no bound.
func CheckWindow(since, until time.Time) error {
	if !since.IsZero() && !until.IsZero() && !until.After(since) {
		return errors.New("want an until after since: nothing first failed between them")
	}
	return nil
}

// Throttle spaces the dead letters a bulk replay or discard handles: at
// most its rate per second, so that the relay publishes the replays at
// that pace. A nil Throttle does not wait.
type Throttle struct {
	limiter *rate.Limiter
	// Now and Sleep are its clock, replaced by tests.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
}

// NewThrottle returns the throttle of perSecond dead letters a second,
// nil for zero (no limit).
func NewThrottle(perSecond float64) *Throttle {
	if perSecond <= 0 {
		return nil
	}
	return &Throttle{limiter: rate.NewLimiter(rate.Limit(perSecond), 1), Now: time.Now, Sleep: sleep}
}

// Wait waits for the next dead letter's turn, or until ctx ends.
func (t *Throttle) Wait(ctx context.Context) error {
	if t == nil {
		return ctx.Err()
	}
	now := t.Now()
	r := t.limiter.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		return t.Sleep(ctx, d)
	}
	return ctx.Err()
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
