package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStmtBound: a statement that runs into its bound doubles the next
// one's, up to the most; one that completes sets it back; a statement
// ended by its parent's end, or failing on its own, changes nothing. A
// watched call's context is ended once the bound passed.
func TestStmtBound(t *testing.T) {
	t.Parallel()
	b := newStmtBound(4 * stmtTimeout)
	require.Equal(t, stmtTimeout, time.Duration(b.cur.Load()))

	// Cut short: the statement waits for its context, which its bound
	// ends (the bound is lowered for the test, as a lost answer would
	// wait for ever).
	b.cur.Store(int64(time.Millisecond))
	lost := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	require.ErrorIs(t, b.run(t.Context(), lost), context.DeadlineExceeded)
	require.Equal(t, 2*time.Millisecond, time.Duration(b.cur.Load()), "doubled")
	b.cur.Store(int64(3 * stmtTimeout))
	b.record(t.Context(), expired(t), context.DeadlineExceeded)
	require.Equal(t, 4*stmtTimeout, time.Duration(b.cur.Load()), "up to the most")

	failed := errors.New("refused")
	require.ErrorIs(t, b.run(t.Context(), func(context.Context) error { return failed }), failed)
	require.Equal(t, 4*stmtTimeout, time.Duration(b.cur.Load()), "a failure of its own changes nothing")
	parent, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, b.run(parent, lost), context.Canceled)
	require.Equal(t, 4*stmtTimeout, time.Duration(b.cur.Load()), "nor does the end of the parent")

	require.NoError(t, b.run(t.Context(), func(context.Context) error { return nil }))
	require.Equal(t, stmtTimeout, time.Duration(b.cur.Load()), "set back")

	// Watched: the transaction's context ends once the bound passed.
	b.cur.Store(int64(time.Millisecond))
	txCtx, cancelTx := context.WithCancel(t.Context())
	defer cancelTx()
	err := b.watch(t.Context(), cancelTx, func() error { <-txCtx.Done(); return txCtx.Err() })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2*time.Millisecond, time.Duration(b.cur.Load()), "doubled")
	require.True(t, newStmtBound(time.Second).cur.Load() == int64(time.Second), "never above the most")
}

// expired returns a context whose deadline passed.
func expired(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 0)
	t.Cleanup(cancel)
	<-ctx.Done()
	return ctx
}
