package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// The bounds of each statement of a batch's transaction on PostgreSQL
// (see stmtBound).
const (
	// stmtTimeout is a statement's bound at first: one whose request or
	// answer was lost on its way (a proxy or middlebox that dropped it,
	// the connection still open) is given up that soon, and its batch
	// with it, instead of holding the relay, and the rows it locked,
	// for twice the batch's timeout.
	stmtTimeout = 3 * time.Second
)

// stmtBound bounds each statement of the relay's batch transactions on
// PostgreSQL: stmtTimeout at first; a statement cut short by it doubles
// it, up to the batch's own bound, so that a statement slow on its own
// (a claim of large rows from a loaded server) is not cut short for
// ever; one that completes sets it back.
type stmtBound struct {
	max time.Duration
	cur atomic.Int64 // a time.Duration
}

func newStmtBound(max time.Duration) *stmtBound {
	b := &stmtBound{max: max}
	b.cur.Store(int64(min(stmtTimeout, max)))
	return b
}

// run runs f on a context of ctx bounded by the current bound, and
// records its outcome.
func (b *stmtBound) run(ctx context.Context, f func(ctx context.Context) error) error {
	sctx, cancel := context.WithTimeout(ctx, time.Duration(b.cur.Load()))
	defer cancel()
	return b.record(ctx, sctx, f(sctx))
}

// watch runs f, whose context cannot be bounded by the statement (the
// transaction's own, for its BEGIN and its COMMIT), and calls cancel,
// which ends that context, once the current bound passed.
func (b *stmtBound) watch(ctx context.Context, cancel context.CancelFunc, f func() error) error {
	sctx, stop := context.WithTimeout(ctx, time.Duration(b.cur.Load()))
	defer stop()
	defer context.AfterFunc(sctx, func() {
		if errors.Is(sctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})()
	return b.record(ctx, sctx, f())
}

// record doubles the bound when sctx, the statement's context, ran out
// while ctx, its parent, did not, and sets it back when err is nil.
func (b *stmtBound) record(ctx, sctx context.Context, err error) error {
	switch {
	case err == nil:
		b.cur.Store(int64(min(stmtTimeout, b.max)))
	case ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded):
		b.cur.Store(int64(min(2*time.Duration(b.cur.Load()), b.max)))
	}
	return err
}
