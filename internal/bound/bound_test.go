package bound_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/bound"
)

// TestStatement: a statement that runs into its bound doubles the next
// one's, up to the most; one that completes sets it back; a statement
// ended by its parent's end, or failing on its own, changes nothing. A
// watched call's context is ended once the bound passed.
func TestStatement(t *testing.T) {
	t.Parallel()
	const base = time.Millisecond
	b := bound.New(base, 4*base)
	require.Equal(t, base, b.Current())

	// Cut short: the statement waits for its context, which its bound
	// ends, as a lost answer would wait for ever.
	lost := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	require.ErrorIs(t, b.Run(t.Context(), lost), context.DeadlineExceeded)
	require.Equal(t, 2*base, b.Current(), "doubled")
	require.ErrorIs(t, b.Run(t.Context(), lost), context.DeadlineExceeded)
	require.ErrorIs(t, b.Run(t.Context(), lost), context.DeadlineExceeded)
	require.Equal(t, 4*base, b.Current(), "up to the most")

	failed := errors.New("refused")
	require.ErrorIs(t, b.Run(t.Context(), func(context.Context) error { return failed }), failed)
	require.Equal(t, 4*base, b.Current(), "a failure of its own changes nothing")
	parent, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, b.Run(parent, lost), context.Canceled)
	require.Equal(t, 4*base, b.Current(), "nor does the end of the parent")

	require.NoError(t, b.Run(t.Context(), func(context.Context) error { return nil }))
	require.Equal(t, base, b.Current(), "set back")

	// Watched: the transaction's context ends once the bound passed.
	txCtx, cancelTx := context.WithCancel(t.Context())
	defer cancelTx()
	err := b.Watch(t.Context(), cancelTx, func() error { <-txCtx.Done(); return txCtx.Err() })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2*base, b.Current(), "doubled")
	require.NoError(t, b.Watch(t.Context(), func() { t.Error("canceled a call that returned in time") }, func() error { return nil }))
	require.Equal(t, base, bound.New(time.Second, base).Current(), "never above the most")
	b.Expired()
	require.Equal(t, 2*base, b.Current(), "Expired doubles")
	b.Reset()
	require.Equal(t, base, b.Current(), "Reset sets back")
}

// TestPostgresMillis: a bound PostgreSQL takes, whatever the duration.
func TestPostgresMillis(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(4000), bound.PostgresMillis(4*time.Second))
	require.Equal(t, int64(1), bound.PostgresMillis(time.Microsecond), "0 would turn the bound off")
	require.Equal(t, int64(1), bound.PostgresMillis(-time.Second), "a deadline already past")
	require.Equal(t, int64(2147483647), bound.PostgresMillis(30*24*time.Hour), "INT_MAX at most")
}
