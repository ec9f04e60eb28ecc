package middleware

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/outage"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// errStopping ends a message's attempts when the service began to stop
// (Config.Stopping) before a further attempt could start. It wraps
// pipeline.ErrLater: the message is nacked, neither dead-lettered nor
// counted as failing, and its next delivery has all its attempts.
var errStopping = fmt.Errorf("stopping, no further attempt: %w", pipeline.ErrLater)

// errUnreachable ends a message's attempts when the last of them failed
// because the database could not be reached or dropped the connection
// (see outage.Is): no fault of the message. It wraps pipeline.ErrLater:
// the message is nacked, never dead-lettered for it, and its next
// delivery has all its attempts.
var errUnreachable = fmt.Errorf("the database is unreachable, no dead letter: %w", pipeline.ErrLater)

// errHandedBack ends a message's attempts when its partition moved to
// another process (driver.ErrFenced: a rebalance) and its effect rolled
// back. It wraps pipeline.ErrLater: the message is nacked, not counted
// towards the delivery limit, and the partition's new owner handles it.
var errHandedBack = fmt.Errorf("its partition moved to another process, no further attempt here: %w", pipeline.ErrLater)

// uncharged reports whether err ended a delivery for no fault of its
// message, a stop or a rebalance: the delivery guard takes its count
// back.
func uncharged(err error) bool {
	return errors.Is(err, errStopping) || errors.Is(err, errHandedBack)
}

// retry runs each message up to attempts times with a constant delay
// between attempts, while the message stays unacknowledged. A permanent
// error (framework.Permanent) ends the retries at once, and so do
// pipeline.ErrLater and the end of the message context (shutdown): then
// the context's cause is returned, unless no attempt was left. Each
// attempt starts from the message context retry received, so the inner
// steps (a timeout, a transaction) begin afresh. Each failed attempt is
// reported to observe, which logs it.
//
// Once stopping is closed (the service began to stop), no further attempt
// starts: a failed attempt that is not the last, or a wait for the next
// attempt (which stopping ends at once), returns errStopping wrapping the
// last attempt's error.
//
// An attempt that failed for an outage of the database (see pauseFor:
// unreachable, or full) is not charged: the attempts pause
// (awaitOutage) and go on. When the last attempt failed because the
// database was unreachable (a restart, a broken connection: outage.Is)
// while a ping did answer, retry returns errUnreachable wrapping that
// failure instead of the failure itself: the message comes again, and is
// never dead-lettered as retries_exhausted for an outage. The attempt in
// flight when stopping closes runs to its end, and a message's first
// attempt always runs. A nil stopping never closes.
//
// It does what watermill's Retry does with a constant delay and
// ResetContextOnRetry, without its backoff's allocations per message: a
// message that succeeds at once costs nothing here, and only a retry
// starts a timer.
func retry(attempts int, delay time.Duration, stopping <-chan struct{}, ping func(context.Context) error) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			out, err := retryAttempts(next, msg, st, attempts, delay, stopping, ping)
			st.resume()
			if err != nil && !uncharged(err) && !errors.Is(err, errUnreachable) {
				st.gaveUp = true
			}
			return out, err
		}
	}
}

// retryAttempts runs next on msg, whose state is st, until an attempt
// succeeds, attempts ran, an error is not to be retried, the message
// context ends or stopping closes.
func retryAttempts(next message.HandlerFunc, msg *message.Message, st *state, attempts int, delay time.Duration, stopping <-chan struct{}, ping func(context.Context) error) ([]*message.Message, error) {
	ctx := msg.Context()
	var wait *time.Timer
	for try := 1; ; try++ {
		out, err := attempt(ctx, next, msg, st)
		if err != nil && ping != nil {
			if reason := pauseFor(ctx, err, ping); reason != "" {
				// The database's outage, not the message's failure: the
				// attempt is not charged, and the next one waits.
				if err := awaitOutage(ctx, st, reason, ping, stopping, try, err); err != nil {
					return out, err
				}
				try--
				continue
			}
		}
		switch {
		case err == nil:
			return out, nil
		case errors.Is(err, driver.ErrFenced):
			return out, fmt.Errorf("%w: %w", errHandedBack, err)
		case try >= attempts && !framework.IsPermanent(err) && outage.Is(err):
			return out, fmt.Errorf("%w (after %d attempts, the last failed: %w)", errUnreachable, try, err)
		case try >= attempts || framework.IsPermanent(err) || errors.Is(err, pipeline.ErrLater):
			return out, err
		case context.Cause(ctx) != nil:
			return out, context.Cause(ctx)
		case closed(stopping):
			return out, stopped(try, err)
		}
		if wait == nil {
			wait = time.NewTimer(delay)
			defer wait.Stop()
		} else {
			wait.Reset(delay)
		}
		select {
		case <-wait.C:
		case <-stopping:
			return out, stopped(try, err)
		case <-ctx.Done():
			return out, context.Cause(ctx)
		}
		if closed(stopping) { // both were ready: stopping wins
			return out, stopped(try, err)
		}
	}
}

// timedOut reports whether err says that a time limit ran out: a
// context's deadline, PostgreSQL's statement timeout (SQLSTATE 57014), a
// network timeout.
func timedOut(err error) bool {
	var (
		state  interface{ SQLState() string }
		netErr net.Error
	)
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &state) && state.SQLState() == "57014" ||
		errors.As(err, &netErr) && netErr.Timeout()
}

// closed reports whether c is closed; a nil c never is.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stopped is the error of a message whose attempts stopped after tries
// of them, the last failing with err, because the service is stopping.
func stopped(tries int, err error) error {
	return fmt.Errorf("%w (after %d attempts, the last failed: %w)", errStopping, tries, err)
}

// attempt runs next on msg once, in the message context ctx, unless ctx
// ended; it counts the attempt in st and reports its failure.
func attempt(ctx context.Context, next message.HandlerFunc, msg *message.Message, st *state) ([]*message.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	msg.SetContext(ctx)
	st.attempts++
	out, err := next(msg)
	switch {
	case err == nil:
		st.resume()
	case ctx.Err() == nil && !errors.Is(err, pipeline.ErrLater):
		st.attemptFailed(ctx, err)
	}
	return out, err
}
