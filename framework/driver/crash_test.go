package driver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// TestCrashWithoutDatabase: on the in-memory store, whose transaction is
// its Tx hooks, an attempt that dies before the commit leaves no mark and
// one that dies after it keeps its mark, as with a database (its hooks,
// the store's commit, ran); each returns a *crash.Died that is a
// pipeline.ErrLater. (The test kit's crash tests
// run the database's paths, alone and in batches.)
func TestCrashWithoutDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		at   crash.Point
		then framework.Outcome
	}{
		{crash.AfterMark, framework.Processed},
		{crash.BeforeCommit, framework.Processed},
		{crash.AfterCommit, framework.Duplicate},
	} {
		t.Run(string(tc.at), func(t *testing.T) {
			t.Parallel()
			store, err := memory.NewStore(memory.StoreConfig{})
			require.NoError(t, err)
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
			require.NoError(t, err)
			key := framework.Key{Source: "test", ID: "e-1"}
			var commits int
			fn := func(ctx context.Context) error {
				tx, _ := pipeline.From[*driver.Tx](ctx)
				tx.OnCommit(func() { commits++ })
				return nil
			}
			dies := crash.With(t.Context(), func(_ context.Context, p crash.Point) bool { return p == tc.at })

			outcome, err := uow.Do(dies, "c", key, fn)
			require.Equal(t, framework.Failed, outcome)
			at, ok := crash.PointOf(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, tc.at, at)
			require.ErrorIs(t, err, pipeline.ErrLater)

			// A mark that outlived the death would hold the memory
			// store's lock of the event: bound the wait.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			outcome, err = uow.Do(ctx, "c", key, fn)
			require.NoError(t, err)
			require.Equal(t, tc.then, outcome)
			// Without a database the hooks are the commit: they ran
			// before a death at AfterCommit.
			require.Equal(t, 1, commits, "the effect committed once")
		})
	}
}
