package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// orders is the consumer of the order tests' batches: each test has a
// schema of its own (migratedStore).
const orders = "orders"

// migratedStore returns the store of a schema of the test's own,
// migrated.
func migratedStore(t *testing.T) (*sqlx.DB, *postgres.Store) {
	t.Helper()
	db := testenv.Postgres(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	return db, store
}

// newUnitOfWork returns a unit of work on store with a transaction per
// attempt: the batches of one process.
func newUnitOfWork(t *testing.T, db *sqlx.DB, store *postgres.Store) *driver.UnitOfWork {
	t.Helper()
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store, BatchSize: 1})
	require.NoError(t, err)
	return uow
}

// inAttempt runs f in the transaction of an attempt of uow on the event
// id (source "test") of orders, as a batch's statements run.
func inAttempt(ctx context.Context, uow *driver.UnitOfWork, id string, f func(ctx context.Context, tx *driver.Tx) error) error {
	_, err := uow.Do(ctx, orders, framework.Key{Source: "test", ID: id}, func(ctx context.Context) error {
		tx, ok := driver.TxFromContext(ctx)
		if !ok {
			return errors.New("no transaction")
		}
		return f(ctx, tx)
	})
	return err
}

// orderBatcher is the batch's strict-order step that the unit of work
// finds on the store by type assertion.
type orderBatcher interface {
	CheckpointMany(ctx context.Context, tx *driver.Tx, consumer string, subjects []string) (map[string]int64, error)
	AdvanceMany(ctx context.Context, tx *driver.Tx, consumer string, subjects []string, seqs []int64) (bool, error)
}

// TestCheckpointManyLocks: CheckpointMany reads the checkpoints of a
// batch's subjects, those it never saw at 0 (making their rows), and
// locks them all until the batch's transaction ends: another batch's
// CheckpointMany of one of them waits, then reads the first batch's
// move, whether the subject's row existed before or not.
func TestCheckpointManyLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := migratedStore(t)
	ob, ok := any(store).(orderBatcher)
	require.True(t, ok, "the store moves a batch's checkpoints in one statement")
	uow := newUnitOfWork(t, db, store)
	// "old" has a checkpoint at 3; "new" has none.
	require.NoError(t, inAttempt(ctx, uow, "setup", func(ctx context.Context, tx *driver.Tx) error {
		_, err := ob.AdvanceMany(ctx, tx, orders, []string{"old"}, []int64{3})
		return err
	}))

	locked, release, first := make(chan map[string]int64, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		first <- inAttempt(ctx, uow, "first", func(ctx context.Context, tx *driver.Tx) error {
			cps, err := ob.CheckpointMany(ctx, tx, orders, []string{"new", "old", "other"})
			locked <- cps
			if err != nil {
				return err
			}
			<-release
			_, err = ob.AdvanceMany(ctx, tx, orders, []string{"old", "new"}, []int64{4, 1})
			return err
		})
	}()
	cps := <-locked
	require.Equal(t, map[string]int64{"new": 0, "old": 3, "other": 0}, cps)

	// A second batch of both: it waits for the first, then reads its
	// moves, the row that existed ("old") as the one it made ("new").
	got, second := make(chan map[string]int64, 1), make(chan error, 1)
	go func() {
		second <- inAttempt(ctx, uow, "second", func(ctx context.Context, tx *driver.Tx) error {
			cps, err := ob.CheckpointMany(ctx, tx, orders, []string{"new", "old"})
			got <- cps
			return err
		})
	}()
	select {
	case cps := <-got:
		t.Fatalf("read %v while the first batch held the rows", cps)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-first)
	require.Equal(t, map[string]int64{"new": 1, "old": 4}, <-got, "the first batch's moves, once it committed")
	require.NoError(t, <-second)
}

// markCheckpointer is the batch's marks and checkpoints in one round trip,
// which the unit of work finds on the store by type assertion.
type markCheckpointer interface {
	MarkCheckpointMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key, subjects []string) ([]bool, map[string]int64, error)
}

// TestMarkCheckpointMany: MarkCheckpointMany reports the marks as
// MarkMany does and reads and locks the checkpoints as CheckpointMany
// does, and inserts the marks before it locks a checkpoint: a batch that
// waits for another's mark holds no checkpoint the other then locks, so
// the two never deadlock.
func TestMarkCheckpointMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := migratedStore(t)
	mc, ok := any(store).(markCheckpointer)
	require.True(t, ok, "the store marks and locks a batch in one statement")
	ob := any(store).(orderBatcher)
	// Two units of work: one's batches wait for each other in its queue,
	// the two's in the database.
	uow, other := newUnitOfWork(t, db, store), newUnitOfWork(t, db, store)
	k := func(id string) framework.Key { return framework.Key{Source: "test", ID: id} }
	require.NoError(t, inAttempt(ctx, uow, "setup", func(ctx context.Context, tx *driver.Tx) error {
		_, err := ob.AdvanceMany(ctx, tx, orders, []string{"old"}, []int64{3})
		return err
	}))
	// A discarded dead letter's event takes no mark (see driver.Store.Mark).
	require.NoError(t, store.PublishDeadLetter(ctx, driver.DeadLetter{
		Consumer: orders, Topic: "t", Source: "test", EventID: "gone", Code: framework.CodeInvalidPayload, Body: []byte("gone"),
	}))
	dls, err := store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: orders, EventID: "gone"})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	_, err = store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"})
	require.NoError(t, err)

	// Y marks "e" and holds it; X then marks "e" too, and waits for Y.
	marked, lock, locked, y := make(chan error, 1), make(chan struct{}), make(chan error, 1), make(chan error, 1)
	go func() {
		y <- inAttempt(ctx, uow, "y", func(ctx context.Context, tx *driver.Tx) error {
			first, cps, err := mc.MarkCheckpointMany(ctx, tx, orders, []framework.Key{k("e"), k("setup"), k("gone"), k("e")}, []string{"old", "new"})
			if err == nil && (!slices.Equal(first, []bool{true, false, false, false}) || cps["old"] != 3 || cps["new"] != 0 || len(cps) != 2) {
				err = fmt.Errorf("marks %v, checkpoints %v", first, cps)
			}
			marked <- err
			if err != nil {
				return err
			}
			<-lock
			// X waits for Y's mark of "e": it must not hold "s" yet, so
			// this lock waits for nothing (lock_timeout: not for X,
			// which would wait for Y: a deadlock).
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '200ms'"); err != nil {
				return err
			}
			_, err = ob.CheckpointMany(ctx, tx, orders, []string{"s"})
			locked <- err
			return err
		})
	}()
	require.NoError(t, <-marked)
	type result struct {
		first []bool
		cps   map[string]int64
		err   error
	}
	x := make(chan result, 1)
	go func() {
		var r result
		r.err = inAttempt(ctx, other, "x", func(ctx context.Context, tx *driver.Tx) error {
			r.first, r.cps, r.err = mc.MarkCheckpointMany(ctx, tx, orders, []framework.Key{k("e")}, []string{"s"})
			return r.err
		})
		x <- r
	}()
	select {
	case r := <-x:
		t.Fatalf("marked %v while another batch held the mark: %v", r.first, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	close(lock)
	require.NoError(t, <-locked, "the batch that held the mark locks a checkpoint the waiting one names, without waiting")
	require.NoError(t, <-y)
	r := <-x
	require.NoError(t, r.err)
	require.Equal(t, []bool{false}, r.first, "marked by the other batch, which committed")
	require.Equal(t, map[string]int64{"s": 0}, r.cps)
}

// markMover is the batch's marks, planned moves and locks in one round
// trip, which the unit of work finds on the store by type assertion.
type markMover interface {
	MarkMoveMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key, lock, move []string, from, to []int64) ([]bool, map[string]int64, bool, error)
}

// TestMarkMoveManyLockOrder: MarkMoveMany locks the rows it moves and
// those it only locks in one order, by subject. Two batches, of processes
// that know different checkpoints (one moves "a" and locks "b", the other
// moves "b" and locks "a"), released together, wait for each other
// instead of deadlocking; both moves are made.
func TestMarkMoveManyLockOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := migratedStore(t)
	mm, ok := any(store).(markMover)
	require.True(t, ok, "the store marks and moves a batch in one statement")
	ob := any(store).(orderBatcher)
	// A unit of work each: the batches of three processes.
	holding, xs, ys := newUnitOfWork(t, db, store), newUnitOfWork(t, db, store), newUnitOfWork(t, db, store)

	// A third batch holds both rows (at 1) while the two queue behind it.
	xid, release, holder := make(chan string, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		holder <- inAttempt(ctx, holding, "holder", func(ctx context.Context, tx *driver.Tx) error {
			if _, err := ob.AdvanceMany(ctx, tx, orders, []string{"a", "b"}, []int64{1, 1}); err != nil {
				return err
			}
			var id string
			if err := tx.GetContext(ctx, &id, `SELECT xid(pg_current_xact_id())::text`); err != nil {
				return err
			}
			xid <- id
			<-release
			return nil
		})
	}()
	holderXID := <-xid
	type result struct {
		cps   map[string]int64
		moved bool
		err   error
	}
	batch := func(uow *driver.UnitOfWork, id, move, lock string) <-chan result {
		out := make(chan result, 1)
		go func() {
			var r result
			r.err = inAttempt(ctx, uow, id, func(ctx context.Context, tx *driver.Tx) error {
				var err error
				_, r.cps, r.moved, err = mm.MarkMoveMany(ctx, tx, orders, []framework.Key{{Source: "test", ID: id + "-event"}},
					[]string{lock}, []string{move}, []int64{1}, []int64{2})
				return err
			})
			out <- r
		}()
		return out
	}
	x := batch(xs, "x", "a", "b")
	y := batch(ys, "y", "b", "a")
	// Both wait for the holder's rows before it lets go: each waits on
	// its first row, and then, with two orders, on the other's.
	require.Eventually(t, func() bool {
		var waiting int
		err := db.GetContext(ctx, &waiting, `SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text = $1`, holderXID)
		return err == nil && waiting == 2
	}, 10*time.Second, 10*time.Millisecond, "both batches wait for the holder")
	close(release)
	require.NoError(t, <-holder)
	rx, ry := <-x, <-y
	require.NoError(t, rx.err, "no deadlock")
	require.NoError(t, ry.err, "no deadlock")
	require.True(t, rx.moved, "x moved a from 1")
	require.True(t, ry.moved, "y moved b from 1")
	// What each locked it read as the other left it: the one that went
	// first read 1, the other the first one's move.
	require.ElementsMatch(t, []int64{1, 2}, []int64{rx.cps["b"], ry.cps["a"]})
	require.NoError(t, inAttempt(ctx, holding, "after", func(ctx context.Context, tx *driver.Tx) error {
		cps, err := ob.CheckpointMany(ctx, tx, orders, []string{"a", "b"})
		if err == nil && (cps["a"] != 2 || cps["b"] != 2) {
			err = fmt.Errorf("checkpoints %v, want a and b at 2", cps)
		}
		return err
	}))
}

// TestMarkMoveManyCompare: each move of MarkMoveMany is a compare-and-set
// of its own subject's checkpoint, whatever the subjects' order: moved is
// false, and the batch rolls back, when a single one of them is not at
// its from (a new subject's is 0); otherwise every move is made.
func TestMarkMoveManyCompare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := migratedStore(t)
	mm := any(store).(markMover)
	ob := any(store).(orderBatcher)
	uow := newUnitOfWork(t, db, store)
	require.NoError(t, inAttempt(ctx, uow, "setup", func(ctx context.Context, tx *driver.Tx) error {
		_, err := ob.AdvanceMany(ctx, tx, orders, []string{"a", "b", "c"}, []int64{1, 3, 7})
		return err
	}))
	reads := 0
	checkpoints := func() map[string]int64 {
		var cps map[string]int64
		reads++ // an attempt of its own each time: the same id would be a duplicate
		require.NoError(t, inAttempt(ctx, uow, fmt.Sprintf("read-%d", reads), func(ctx context.Context, tx *driver.Tx) error {
			var err error
			cps, err = ob.CheckpointMany(ctx, tx, orders, []string{"a", "b", "c", "d"})
			return err
		}))
		return cps
	}
	errNotMoved := errors.New("not moved")
	for i, c := range []struct {
		move     []string
		from, to []int64
	}{
		{[]string{"a", "b", "c"}, []int64{1, 2, 7}, []int64{2, 4, 8}}, // b is at 3
		{[]string{"c", "b", "a"}, []int64{7, 3, 2}, []int64{8, 4, 3}}, // a is at 1
		{[]string{"d", "a"}, []int64{1, 1}, []int64{2, 2}},            // d is new: at 0
		{[]string{"b", "d"}, []int64{3, 0}, []int64{4, 1}},            // … only b's is wrong
	} {
		if i == 3 {
			c.from[0] = 2
		}
		err := inAttempt(ctx, uow, fmt.Sprintf("batch-%d", i), func(ctx context.Context, tx *driver.Tx) error {
			_, _, moved, err := mm.MarkMoveMany(ctx, tx, orders, []framework.Key{{Source: "test", ID: fmt.Sprintf("e-%d", i)}}, nil, c.move, c.from, c.to)
			if err == nil && !moved {
				err = errNotMoved
			}
			return err
		})
		require.ErrorIs(t, err, errNotMoved, "moves %v from %v", c.move, c.from)
	}
	require.Equal(t, map[string]int64{"a": 1, "b": 3, "c": 7, "d": 0}, checkpoints(), "no move was made")
	require.NoError(t, inAttempt(ctx, uow, "moves", func(ctx context.Context, tx *driver.Tx) error {
		_, _, moved, err := mm.MarkMoveMany(ctx, tx, orders, []framework.Key{{Source: "test", ID: "e-ok"}},
			nil, []string{"c", "a", "d", "b"}, []int64{7, 1, 0, 3}, []int64{9, 2, 1, 5})
		if err == nil && !moved {
			err = errNotMoved
		}
		return err
	}))
	require.Equal(t, map[string]int64{"a": 2, "b": 5, "c": 9, "d": 1}, checkpoints())
}
