package driver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
)

// TestWithoutMark: a unit of work without the processed mark runs every
// attempt of an event, in batches too (where the SQL stores would mark
// the batch's events in one statement), and still commits each attempt's
// writes with its batch.
func TestWithoutMark(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 8, Batches: 1, Overlap: 1, WithoutMark: true}) // see groupBackend.unitOfWork
			require.NoError(t, err)
			upsert := b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET seen = effects.seen + 1`)
			ids := []string{"a", "b", "c"}
			var txids [2]map[string]string
			for round := range txids {
				txids[round] = map[string]string{}
				seen := txids[round]
				outcomes, errs := gather(t, uow, ids, func(ctx context.Context, id string) error {
					conn := framework.Conn(ctx, b.db)
					txid, err := b.txid(ctx, conn)
					if err != nil {
						return err
					}
					seen[id] = txid // attempts of one batch run one after another
					_, err = conn.ExecContext(ctx, upsert, id)
					return err
				})
				for i := range ids {
					require.NoError(t, errs[i])
					require.Equal(t, framework.Processed, outcomes[i], "round %d, %s", round, ids[i])
				}
				require.Equal(t, seen["a"], seen["c"], "round %d ran in one batch", round)
			}
			var seen []int
			require.NoError(t, b.db.SelectContext(t.Context(), &seen, `SELECT seen FROM effects ORDER BY id`))
			require.Equal(t, []int{2, 2, 2}, seen, "each event took effect on each delivery")
			var marks int
			require.NoError(t, b.db.GetContext(t.Context(), &marks, `SELECT count(*) FROM processed_events`))
			require.Zero(t, marks, "no attempt took a mark")
		})
	}
}

// outlivingStore says that its marks stay when an attempt rolls back.
type outlivingStore struct{ driver.Store }

func (outlivingStore) MarkScope() driver.MarkScope { return driver.MarkOutlivesRollback }

// TestMarkCheck: NewUnitOfWork refuses a store whose marks outlive a
// rollback, naming the check, and takes the in-memory store, whose marks
// go with a rollback, beside a database.
func TestMarkCheck(t *testing.T) {
	t.Parallel()
	b := groupBackends()["SQLite"](t)
	mem, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	require.Equal(t, driver.MarkReleasedOnRollback, driver.MarkScopeOf(mem))
	require.Equal(t, driver.MarkInTx, driver.MarkScopeOf(b.store))

	_, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: outlivingStore{b.store}})
	require.ErrorContains(t, err, "UnitOfWorkConfig.Store: mark check: processed store driver_test.outlivingStore keeps its marks outside the database transaction")
	_, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: outlivingStore{mem}})
	require.ErrorContains(t, err, "mark check")

	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: mem})
	require.NoError(t, err)
	key := framework.Key{Source: "s", ID: "e"}
	failed := func(context.Context) error { return context.Canceled }
	outcome, _ := uow.Do(t.Context(), "c", key, failed)
	require.Equal(t, framework.Failed, outcome)
	outcome, err = uow.Do(t.Context(), "c", key, func(context.Context) error { return nil })
	require.NoError(t, err)
	require.Equal(t, framework.Processed, outcome, "the failed attempt's mark went with its rollback")
}
