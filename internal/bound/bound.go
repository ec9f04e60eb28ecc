// Package bound bounds statements whose request or answer the network may
// lose while the connection stays open (a proxy or middlebox that dropped
// it): nothing but a statement's own bound ends such a wait.
package bound

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// First is the first bound of a statement that may be lost: one whose
// request or answer went missing waits for nothing, and is given up that
// soon. A live statement rarely takes as long on a healthy server, and
// each one cut short doubles the next one's bound (see Statement).
const First = 3 * time.Second

// Statement bounds a run of statements: Base at first; a statement cut
// short by its bound doubles it, up to Max, so that a statement slow on
// its own (a large write on a loaded server) is not cut short for ever;
// one that completes sets it back to Base. It is safe for concurrent use.
type Statement struct {
	base, max time.Duration
	cur       atomic.Int64 // a time.Duration
}

// New returns a Statement bound of base at first, at most max.
func New(base, max time.Duration) *Statement {
	b := &Statement{base: min(base, max), max: max}
	b.cur.Store(int64(b.base))
	return b
}

// Current returns the bound the next statement gets.
func (b *Statement) Current() time.Duration { return time.Duration(b.cur.Load()) }

// Context returns ctx bounded by the current bound, for a statement that
// runs on it; pass its outcome to Record.
func (b *Statement) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.Current())
}

// Run runs f on a context of ctx bounded by the current bound, and
// records its outcome.
func (b *Statement) Run(ctx context.Context, f func(ctx context.Context) error) error {
	sctx, cancel := b.Context(ctx)
	defer cancel()
	return b.Record(ctx, sctx, f(sctx))
}

// Watch runs f, whose context the statement cannot bound (a
// transaction's own, for its BEGIN and its COMMIT), and calls cancel,
// which ends that context, once the current bound passed.
func (b *Statement) Watch(ctx context.Context, cancel context.CancelFunc, f func() error) error {
	sctx, stop := b.Context(ctx)
	defer stop()
	defer context.AfterFunc(sctx, func() {
		if errors.Is(sctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})()
	return b.Record(ctx, sctx, f())
}

// Record doubles the bound when sctx, the statement's context, ran out
// while ctx, its parent, did not, sets it back when err is nil, and
// returns err.
func (b *Statement) Record(ctx, sctx context.Context, err error) error {
	switch {
	case err == nil:
		b.Reset()
	case ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded):
		b.Expired()
	}
	return err
}

// Expired records that a statement ran into its bound: it doubles the
// bound, up to the most.
func (b *Statement) Expired() { b.cur.Store(int64(min(2*b.Current(), b.max))) }

// Reset sets the bound back, as a statement that completes does.
func (b *Statement) Reset() { b.cur.Store(int64(b.base)) }

// maxPostgresMillis is the most PostgreSQL's timeout settings take, in
// milliseconds (INT_MAX, about 24.8 days).
const maxPostgresMillis = math.MaxInt32

// PostgresMillis returns d in milliseconds as PostgreSQL's timeout
// settings (statement_timeout, idle_in_transaction_session_timeout) take
// it: at least 1, since 0 turns the bound off, and at most INT_MAX, since
// a larger value fails the statement that sets it.
func PostgresMillis(d time.Duration) int64 {
	return min(max(d.Milliseconds(), 1), maxPostgresMillis)
}
