package driver_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// TestOutsideCallsHoldNoConnection: once a consumer's handlers wait
// outside the database (the attempts overlap), an attempt's transaction
// begins at its handler's first statement, on PostgreSQL: while four
// handlers wait, the pool lends no connection, and no transaction is
// open. Each effect commits once with its mark. A processed event does
// not run its handler. An attempt whose event another delivery marked
// while its handler waited runs again with its transaction begun first,
// and finds the mark: its effect rolls back, it is a duplicate, and it
// costs no attempt.
func TestOutsideCallsHoldNoConnection(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store})
	require.NoError(t, err)
	insert := func(ctx context.Context, id string) error {
		_, err := framework.Conn(ctx, b.db).ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id)
		return err
	}
	for i := 0; !driver.Overlapping(uow); i++ {
		require.Less(t, i, 100, "the attempts do not overlap")
		_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: fmt.Sprint("learn-", i)}, func(ctx context.Context) error {
			time.Sleep(5 * time.Millisecond)
			return insert(ctx, fmt.Sprint("learn-", i))
		})
		require.NoError(t, err)
	}

	const wait = 300 * time.Millisecond
	var (
		waiting sync.WaitGroup
		wg      sync.WaitGroup
	)
	waiting.Add(4)
	for i := range 4 {
		id := fmt.Sprint("outside-", i)
		wg.Go(func() {
			outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
				waiting.Done()
				time.Sleep(wait) // the outside call
				return insert(ctx, id)
			})
			require.NoError(t, err)
			require.Equal(t, framework.Processed, outcome)
		})
	}
	waiting.Wait()
	time.Sleep(wait / 3)
	require.Zero(t, b.db.Stats().InUse, "connections lent while the handlers wait outside")
	var open int
	require.NoError(t, b.db.GetContext(ctx, &open, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state LIKE 'idle in transaction%'`))
	require.Zero(t, open, "transactions open while the handlers wait outside")
	wg.Wait()

	// A processed event: its handler does not run.
	outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "outside-0"}, func(context.Context) error {
		t.Error("the handler of a processed event ran")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, framework.Duplicate, outcome)

	// Another delivery marks the event while the handler waits: the
	// attempt runs again, its transaction begun first, and finds the mark.
	var runs atomic.Int32
	outcome, err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: "raced"}, func(ctx context.Context) error {
		if runs.Add(1) == 1 {
			other, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 1})
			if err != nil {
				return err
			}
			o, err := other.Do(context.WithoutCancel(ctx), "c", framework.Key{Source: "s", ID: "raced"}, func(ctx context.Context) error {
				return insert(ctx, "raced-other")
			})
			if err != nil || o != framework.Processed {
				return fmt.Errorf("the other delivery: %v, %w", o, err)
			}
		}
		return insert(ctx, "raced")
	})
	require.NoError(t, err)
	require.Equal(t, framework.Duplicate, outcome, "the mark the other delivery took")
	require.Equal(t, int32(1), runs.Load(), "the handler ran once: its run again found the mark first")

	var ids []string
	require.NoError(t, b.db.SelectContext(ctx, &ids, `SELECT id FROM effects WHERE id NOT LIKE 'learn-%' ORDER BY id`))
	require.Equal(t, []string{"outside-0", "outside-1", "outside-2", "outside-3", "raced-other"}, ids, "each effect once, the raced one's rolled back")
}

// TestOutsideCallsCheckpointMoved: under strict order, an attempt whose
// transaction begins at its handler's first statement checks that its
// subject's checkpoint is the one read before the handler ran; when it
// moved meanwhile, the attempt runs again with its transaction begun
// first, and its strict-order step reads the checkpoint itself.
func TestOutsideCallsCheckpointMoved(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store})
	require.NoError(t, err)
	for i := 0; !driver.Overlapping(uow); i++ {
		require.Less(t, i, 100, "the attempts do not overlap")
		_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: fmt.Sprint("learn-", i)}, func(context.Context) error {
			time.Sleep(5 * time.Millisecond)
			return nil
		})
		require.NoError(t, err)
	}
	var (
		steps []*pipeline.OrderStep
		runs  int
	)
	outcome, err := uow.DoDelivery(ctx, "c", framework.Key{Source: "s", ID: "e2"}, driver.Delivery{OrderedSubject: "order-1"}, func(ctx context.Context) error {
		runs++
		at, _ := pipeline.From[pipeline.Attempt](ctx)
		steps = append(steps, at.Order)
		if runs == 1 {
			// Another process moves the subject's checkpoint meanwhile.
			other, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 1})
			if err != nil {
				return err
			}
			if _, err := other.Do(context.WithoutCancel(ctx), "c", framework.Key{Source: "s", ID: "e1"}, func(ctx context.Context) error {
				tx, _ := driver.TxFromContext(ctx)
				_, err := b.store.Advance(ctx, tx, "c", "order-1", 1)
				return err
			}); err != nil {
				return err
			}
		}
		_, err := framework.Conn(ctx, b.db).ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, $2)`, "e2", runs)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, framework.Processed, outcome)
	require.Equal(t, 2, runs, "run again once the checkpoint moved")
	require.NotNil(t, steps[0], "the first run's step: the checkpoint read before it")
	require.Zero(t, steps[0].Checkpoint)
	require.Nil(t, steps[1], "the run again reads the checkpoint itself")
	var seen int
	require.NoError(t, b.db.GetContext(ctx, &seen, `SELECT seen FROM effects WHERE id = 'e2'`))
	require.Equal(t, 2, seen, "the second run's effect, once")
}
