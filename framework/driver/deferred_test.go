package driver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// TestOutsideCallsHoldNoConnection: once a consumer's handlers wait
// outside the database (the attempts overlap), an attempt's transaction
// begins at its handler's first statement, on PostgreSQL: while four
// handlers wait, the pool lends no connection (so no transaction is
// open). Each effect commits once with its mark. A processed event does
// not run its handler. An attempt whose event another delivery marked
// while its handler waited runs again with its transaction begun first,
// and finds the mark: its effect rolls back, it is a duplicate, and it
// costs no attempt.
func TestOutsideCallsHoldNoConnection(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow := overlappingUnit(t, b, 0)

	const wait = time.Second
	var (
		waiting sync.WaitGroup
		wg      sync.WaitGroup
		waited  atomic.Int32
	)
	waiting.Add(4)
	for i := range 4 {
		id := fmt.Sprint("outside-", i)
		wg.Go(func() {
			outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
				waiting.Done()
				time.Sleep(wait) // the outside call
				waited.Add(1)
				return b.insert(ctx, id)
			})
			require.NoError(t, err)
			require.Equal(t, framework.Processed, outcome)
		})
	}
	waiting.Wait()
	// A transaction holds its connection: none lent, none open, while
	// the four wait (the pool may lend one a moment for its own sake).
	inUse := -1
	for deadline := time.Now().Add(wait / 2); inUse != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		inUse = b.db.Stats().InUse
	}
	require.Zero(t, inUse, "connections lent while the handlers wait outside")
	require.Zero(t, waited.Load(), "the handlers were waiting still")
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
				return b.insert(ctx, "raced-other")
			})
			if err != nil || o != framework.Processed {
				return fmt.Errorf("the other delivery: %v, %w", o, err)
			}
		}
		return b.insert(ctx, "raced")
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
	uow := overlappingUnit(t, b, 0)
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

// overlappingUnit returns a unit of work on b, of the given Overlap (0:
// the default), whose handlers have been seen to wait outside the
// database: its attempts overlap, their transactions deferred.
func overlappingUnit(t *testing.T, b groupBackend, overlap int) *driver.UnitOfWork {
	t.Helper()
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, Overlap: overlap})
	require.NoError(t, err)
	for i := 0; !driver.Overlapping(uow); i++ {
		require.Less(t, i, 100, "the attempts do not overlap")
		_, err := uow.Do(t.Context(), "c", framework.Key{Source: "s", ID: fmt.Sprint("learn-", i)}, func(context.Context) error {
			time.Sleep(5 * time.Millisecond)
			return nil
		})
		require.NoError(t, err)
	}
	return uow
}

// outsideCall is a deferred attempt's handler up to its first statement:
// it waits 10 ms outside the database; then the attempt "slow" joins a
// batch (its first statement), closes slowIn, and holds the batch's
// transaction for 3 s, while other attempts join the next batch: long
// enough for all of them to reach their first statement on a loaded
// machine (with a second, a make test once saw neither of two events of a
// subject refused, as when they join batches of their own). It returns
// the attempt's connection.
func outsideCall(ctx context.Context, b groupBackend, id string, slowIn chan struct{}) (sqlx.ExtContext, error) {
	time.Sleep(10 * time.Millisecond) // the outside call
	conn := framework.Conn(ctx, b.db)
	if id != "slow" {
		return conn, nil
	}
	if _, err := conn.ExecContext(ctx, `SELECT 1`); err != nil {
		return nil, err
	}
	close(slowIn)
	_, err := conn.ExecContext(ctx, `SELECT pg_sleep(3)`)
	return conn, err
}

// TestDeferredAttemptsShareBatches: deferred attempts that reach their
// first statement while a batch runs share the next batch's transaction,
// one after another, so that their marks and commit are made once for
// all. A slow attempt's batch holds the transaction 3 s; four attempts
// reach their statements meanwhile, and commit in one transaction, each
// effect once.
func TestDeferredAttemptsShareBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow := overlappingUnit(t, b, 0)
	var (
		mu    sync.Mutex
		txids = map[string]string{}
		wg    sync.WaitGroup
	)
	slowIn := make(chan struct{})
	run := func(id string) {
		outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
			conn, err := outsideCall(ctx, b, id, slowIn)
			if err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, id); err != nil {
				return err
			}
			txid, err := b.txid(ctx, conn)
			mu.Lock()
			txids[id] = txid
			mu.Unlock()
			return err
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, outcome)
	}
	wg.Go(func() { run("slow") })
	<-slowIn // the slow one's batch runs
	for i := range 4 {
		wg.Go(func() { run(fmt.Sprint("quick-", i)) })
	}
	wg.Wait()
	require.NotEqual(t, txids["slow"], txids["quick-0"])
	for i := 1; i < 4; i++ {
		require.Equal(t, txids["quick-0"], txids[fmt.Sprint("quick-", i)], "the attempts that joined meanwhile share a batch: %v", txids)
	}
	var n int
	require.NoError(t, b.db.GetContext(ctx, &n, `SELECT count(*) FROM effects WHERE id = 'slow' OR id LIKE 'quick-%'`))
	require.Equal(t, 5, n, "each effect once")
}

// TestDeferredBatchMateFails: when an attempt of a deferred batch fails,
// the batch rolls back; the failed attempt keeps its failure, and its
// batch-mates run again alone, handler included, each effect committed
// once.
func TestDeferredBatchMateFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow := overlappingUnit(t, b, 0)
	var (
		mu   sync.Mutex
		runs = map[string]int{}
		wg   sync.WaitGroup
	)
	slowIn := make(chan struct{})
	run := func(id string, fail bool) (framework.Outcome, error) {
		return uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
			mu.Lock()
			runs[id]++
			mu.Unlock()
			conn, err := outsideCall(ctx, b, id, slowIn)
			if err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, id); err != nil {
				return err
			}
			if fail {
				time.Sleep(20 * time.Millisecond) // its batch-mates have joined
				return fmt.Errorf("handler of %s fails", id)
			}
			return nil
		})
	}
	wg.Go(func() {
		_, err := run("slow", false)
		require.NoError(t, err)
	})
	<-slowIn // the slow one's batch runs
	var failed error
	wg.Go(func() { _, failed = run("failing", true) })
	time.Sleep(5 * time.Millisecond) // it joins first
	for i := range 3 {
		wg.Go(func() {
			outcome, err := run(fmt.Sprint("mate-", i), false)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, outcome)
		})
	}
	wg.Wait()
	require.ErrorContains(t, failed, "handler of failing fails")
	var ids []string
	require.NoError(t, b.db.SelectContext(ctx, &ids, `SELECT id FROM effects WHERE id NOT LIKE 'learn-%' ORDER BY id`))
	require.Equal(t, []string{"mate-0", "mate-1", "mate-2", "slow"}, ids, "each effect once, the failed one's rolled back")
	again := 0
	for i := range 3 {
		again += runs[fmt.Sprint("mate-", i)] - 1
	}
	require.Positive(t, again, "batch-mates of the failed attempt ran again: %v", runs)
}

// TestOutsideCallsBeyondOverlap: Overlap bounds the connections that the
// overlapping attempts hold, not how many of them wait outside the
// database at once. With Overlap 2, eight handlers that wait outside all
// wait at the same time (each attempt's transaction begins at its first
// statement: none holds a connection while it waits); their effects
// commit once each, and the pool never lends more than Overlap and the
// batches' connections. Before, the two tokens were held through each
// handler's wait: two waited at a time.
func TestOutsideCallsBeyondOverlap(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow := overlappingUnit(t, b, 2)

	const n = 8
	var (
		wg                  sync.WaitGroup
		outside, mostAtOnce atomic.Int32
		mostInUse           int
		sampled             = make(chan struct{})
		done                = make(chan struct{})
	)
	go func() { // the most connections the pool lends at once
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			mostInUse = max(mostInUse, b.db.Stats().InUse)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	for i := range n {
		id := fmt.Sprint("outside-", i)
		wg.Go(func() {
			outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
				now := outside.Add(1)
				for most := mostAtOnce.Load(); now > most && !mostAtOnce.CompareAndSwap(most, now); most = mostAtOnce.Load() {
				}
				// The outside call lasts until every handler is outside
				// with it (or 10 s, when they cannot all be): a fixed
				// wait let a handler return before the last one, slow to
				// start on a loaded machine, went outside.
				for deadline := time.Now().Add(10 * time.Second); mostAtOnce.Load() < n && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				outside.Add(-1)
				return b.insert(ctx, id)
			})
			require.NoError(t, err)
			require.Equal(t, framework.Processed, outcome)
		})
	}
	wg.Wait()
	close(done)
	<-sampled
	require.EqualValues(t, n, mostAtOnce.Load(), "handlers waiting outside at once")
	require.LessOrEqual(t, mostInUse, 2+driver.DefaultBatches, "connections lent at once: Overlap and the batches'")
	var got int
	require.NoError(t, b.db.GetContext(ctx, &got, `SELECT count(*) FROM effects WHERE id LIKE 'outside-%'`))
	require.Equal(t, n, got, "each effect once")
}

// TestDeferredRefusedAttemptsKeepNoMark: a deferred batch refuses, to
// run again alone, the second event of a subject in it and an event
// whose subject's checkpoint moved while its handler waited outside; the
// batch commits its other attempts without the refused ones' marks, so
// that each of them, run again alone, takes effect. Before, the statement
// that marked the batch's events marked the refused ones too, and their
// batch-mates' commit kept the marks: run again, each found its mark and
// was a duplicate, its effect lost.
func TestDeferredRefusedAttemptsKeepNoMark(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	uow := overlappingUnit(t, b, 0)
	var (
		mu   sync.Mutex
		runs = map[string]int{}
		wg   sync.WaitGroup
	)
	slowIn := make(chan struct{})
	run := func(id, subject string, moveFirst bool) (framework.Outcome, error) {
		return uow.DoDelivery(ctx, "c", framework.Key{Source: "s", ID: id}, driver.Delivery{OrderedSubject: subject}, func(ctx context.Context) error {
			mu.Lock()
			runs[id]++
			n := runs[id]
			mu.Unlock()
			conn, err := outsideCall(ctx, b, id, slowIn)
			if err != nil {
				return err
			}
			if moveFirst && n == 1 {
				// Another process moves the subject's checkpoint while
				// the handler waits outside.
				other, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 1})
				if err != nil {
					return err
				}
				if _, err := other.Do(context.WithoutCancel(ctx), "c", framework.Key{Source: "s", ID: id + "-mover"}, func(ctx context.Context) error {
					tx, _ := driver.TxFromContext(ctx)
					_, err := b.store.Advance(ctx, tx, "c", subject, 1)
					return err
				}); err != nil {
					return err
				}
			}
			_, err = conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, $2)`, id, n)
			return err
		})
	}
	wg.Go(func() {
		_, err := run("slow", "", false)
		require.NoError(t, err)
	})
	<-slowIn // the slow one's batch runs: the others join the next one
	for _, c := range []struct {
		id, subject string
		move        bool
	}{
		{"first-of-a", "order-a", false},
		{"second-of-a", "order-a", false},
		{"moved-b", "order-b", true},
		{"plain", "", false},
	} {
		wg.Go(func() {
			outcome, err := run(c.id, c.subject, c.move)
			require.NoError(t, err, c.id)
			require.Equal(t, framework.Processed, outcome, "%s: its effect was lost", c.id)
		})
	}
	wg.Wait()
	var ids []string
	require.NoError(t, b.db.SelectContext(ctx, &ids, `SELECT id FROM effects WHERE id NOT LIKE 'learn-%' ORDER BY id`))
	require.Equal(t, []string{"first-of-a", "moved-b", "plain", "second-of-a", "slow"}, ids, "each effect once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, runs["moved-b"], "refused, it ran again: %v", runs)
	require.Equal(t, 1, runs["plain"], "its batch committed it: %v", runs)
	require.Equal(t, 3, runs["first-of-a"]+runs["second-of-a"], "one of the subject's two ran again: %v", runs)
}

// failingMarks is a PostgreSQL store whose MarkCheckpointMany fails once
// fail is set.
type failingMarks struct {
	*postgres.Store
	fail atomic.Bool
}

func (f *failingMarks) MarkCheckpointMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key, subjects []string) ([]bool, map[string]int64, error) {
	if f.fail.Load() {
		return nil, nil, errors.New("marks refused")
	}
	return f.Store.MarkCheckpointMany(ctx, tx, consumer, keys, subjects)
}

// TestDeferredMarksFail: when the statement that marks a deferred batch's
// events fails, its attempts fail with its error, and the second event of
// a subject, refused before it, runs again alone and takes effect.
func TestDeferredMarksFail(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["PostgreSQL"](t)
	store := &failingMarks{Store: b.store.(*postgres.Store)}
	b.store = store
	uow := overlappingUnit(t, b, 0)
	store.fail.Store(true)
	var wg sync.WaitGroup
	slowIn := make(chan struct{})
	run := func(id, subject string) (framework.Outcome, error) {
		return uow.DoDelivery(ctx, "c", framework.Key{Source: "s", ID: id}, driver.Delivery{OrderedSubject: subject}, func(ctx context.Context) error {
			conn, err := outsideCall(ctx, b, id, slowIn)
			if err != nil {
				return err
			}
			_, err = conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, id)
			return err
		})
	}
	wg.Go(func() {
		_, err := run("slow", "")
		require.NoError(t, err)
	})
	<-slowIn
	outcomes := make(map[string]framework.Outcome)
	errs := make(map[string]error)
	var mu sync.Mutex
	for _, id := range []string{"one", "two"} {
		wg.Go(func() {
			outcome, err := run(id, "order-a")
			mu.Lock()
			outcomes[id], errs[id] = outcome, err
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the attempts did not return: a deferred batch waits for ever")
	}
	failed, processed := 0, 0
	for id, err := range errs {
		switch {
		case err != nil:
			require.ErrorContains(t, err, "marks refused", id)
			failed++
		case outcomes[id] == framework.Processed:
			processed++
		}
	}
	require.Equal(t, 1, failed, "the one marked in the batch fails: %v %v", outcomes, errs)
	require.Equal(t, 1, processed, "the one refused before the marks runs alone: %v %v", outcomes, errs)
}
