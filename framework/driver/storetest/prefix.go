package storetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

func exercisePrefix(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("PrefixesDoNotInterfere", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		a, uowA := b.open(t, "a_")
		c, uowC := b.open(t, "tenant_c_")
		const consumer = "billing.charge"
		key := framework.Key{Source: "orders", ID: "1"}
		nop := func(context.Context) error { return nil }

		for _, uow := range []*driver.UnitOfWork{b.uow, uowA, uowC} {
			out, err := b.do(ctx, uow, consumer, key, nop)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
		}
		out, err := b.do(ctx, uowA, consumer, key, nop)
		require.NoError(t, err)
		require.Equal(t, framework.Duplicate, out)

		n, err := a.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = c.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		require.NoError(t, a.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		require.Len(t, mustList(t, a), 1)
		require.Empty(t, mustList(t, c))
		require.Empty(t, mustList(t, b.store))
	})
}

func mustList(t *testing.T, s driver.Store) []driver.DeadLetter {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), driver.DeadLetterFilter{})
	require.NoError(t, err)
	return dls
}
