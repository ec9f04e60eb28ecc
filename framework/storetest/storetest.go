package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Config says how the suite wants a store.
type Config struct {
	// TablePrefix prefixes the store's tables; the harness migrates them.
	// In-memory stores ignore it: each of their stores is separate anyway.
	TablePrefix string
	// Now is the store's clock.
	Now func() time.Time
}

// Harness is one case's database and the way to open stores on it.
type Harness struct {
	// DB is the database of the stores and of the unit of work; nil for an
	// in-memory store.
	DB *sqlx.DB
	// NewStore returns a store on DB configured by cfg, with its tables
	// migrated. It may be called several times with different prefixes.
	NewStore func(t *testing.T, cfg Config) framework.Store
}

// Exercise runs the conformance suite. newHarness is called once per case,
// from the case's own (parallel) test, and must return a harness on a
// database of the case's own.
func Exercise(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()

	t.Run("Processed", func(t *testing.T) {
		t.Parallel()
		exerciseProcessed(t, newHarness)
	})
	t.Run("Deliveries", func(t *testing.T) {
		t.Parallel()
		exerciseDeliveries(t, newHarness)
	})
	t.Run("DeadLetters", func(t *testing.T) {
		t.Parallel()
		exerciseDeadLetters(t, newHarness)
	})
	t.Run("Replays", func(t *testing.T) {
		t.Parallel()
		exerciseReplays(t, newHarness)
	})
	t.Run("TablePrefix", func(t *testing.T) {
		t.Parallel()
		exercisePrefix(t, newHarness)
	})
	t.Run("Checkpoints", func(t *testing.T) {
		t.Parallel()
		exerciseCheckpoints(t, newHarness)
	})
	t.Run("Waits", func(t *testing.T) {
		t.Parallel()
		exerciseWaits(t, newHarness)
	})
	t.Run("Parked", func(t *testing.T) {
		t.Parallel()
		exerciseParked(t, newHarness)
	})
	t.Run("Purge", func(t *testing.T) {
		t.Parallel()
		exercisePurge(t, newHarness)
	})
	t.Run("Adopt", func(t *testing.T) {
		t.Parallel()
		exerciseAdopt(t, newHarness)
	})
}

// t0 is the fake clock's start, at PostgreSQL's microsecond precision.
var t0 = time.Date(2026, 3, 4, 5, 6, 7, 890123000, time.UTC)

// clock is a fake clock that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: t0} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d and returns the new time.
func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// bundle is what each case works with.
type bundle struct {
	h       Harness
	store   framework.Store
	uow     *framework.UnitOfWork
	clock   *clock
	effects *effects
	// attempts numbers the attempts of inTx.
	attempts atomic.Int64
}

func setup(t *testing.T, newHarness func(t *testing.T) Harness) *bundle {
	t.Helper()
	h := newHarness(t)
	b := &bundle{h: h, clock: newClock(), effects: newEffects(t, h.DB)}
	b.store, b.uow = b.open(t, "")
	return b
}

// open returns a store with prefix and a unit of work over it.
func (b *bundle) open(t *testing.T, prefix string) (framework.Store, *framework.UnitOfWork) {
	t.Helper()
	s := b.h.NewStore(t, Config{TablePrefix: prefix, Now: b.clock.Now})
	uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{DB: b.h.DB, Store: s})
	require.NoError(t, err)
	return s, uow
}

// do runs fn in uow and counts the effects fn wrote when the unit of work
// committed them.
func (b *bundle) do(ctx context.Context, uow *framework.UnitOfWork, consumer string, key framework.Key, fn func(ctx context.Context) error) (framework.Outcome, error) {
	return b.effects.do(ctx, uow, consumer, key, fn)
}

// effects records business writes: rows of a table "effects" without a
// unique constraint when there is a database, else ids counted on commit.
type effects struct {
	db *sqlx.DB

	mu  sync.Mutex
	ids map[string]int
}

type pendingKey struct{}

func newEffects(t *testing.T, db *sqlx.DB) *effects {
	t.Helper()
	if db != nil {
		_, err := db.ExecContext(context.Background(), `CREATE TABLE effects (id TEXT NOT NULL)`)
		require.NoError(t, err)
	}
	return &effects{db: db, ids: map[string]int{}}
}

func (e *effects) do(ctx context.Context, uow *framework.UnitOfWork, consumer string, key framework.Key, fn func(ctx context.Context) error) (framework.Outcome, error) {
	var pending []string
	out, err := uow.Do(context.WithValue(ctx, pendingKey{}, &pending), consumer, key, fn)
	if e.db == nil && out == framework.Processed {
		e.mu.Lock()
		for _, id := range pending {
			e.ids[id]++
		}
		e.mu.Unlock()
	}
	return out, err
}

// write records the effect id in the attempt running in ctx.
func (e *effects) write(ctx context.Context, id string) error {
	if e.db == nil {
		p := ctx.Value(pendingKey{}).(*[]string)
		*p = append(*p, id)
		return nil
	}
	if _, ok := framework.TxFromContext(ctx); !ok {
		return errors.New("effects: no transaction in the context")
	}
	_, err := framework.Conn(ctx, e.db).ExecContext(ctx, e.db.Rebind(`INSERT INTO effects (id) VALUES (?)`), id)
	if err != nil {
		return fmt.Errorf("write effect %s: %w", id, err)
	}
	return nil
}

// count returns how many times the effect id committed.
func (e *effects) count(t *testing.T, id string) int {
	t.Helper()
	if e.db == nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.ids[id]
	}
	var n int
	err := e.db.GetContext(context.Background(), &n, e.db.Rebind(`SELECT count(*) FROM effects WHERE id = ?`), id)
	require.NoError(t, err)
	return n
}

var errBoom = errors.New("boom")

func exerciseProcessed(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "billing.charge-on-order-placed"
	key := framework.Key{Source: "orders", ID: "order-1"}

	t.Run("MarkThenDuplicateAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		var calls atomic.Int32
		fn := func(ctx context.Context) error {
			calls.Add(1)
			return b.effects.write(ctx, "charge")
		}

		out, err := b.do(ctx, b.uow, consumer, key, fn)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		out, err = b.do(ctx, b.uow, consumer, key, fn)
		require.NoError(t, err)
		require.Equal(t, framework.Duplicate, out)
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("RolledBackMarkIsReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()

		out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			require.NoError(t, b.effects.write(ctx, "charge"))
			return errBoom
		})
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, framework.Failed, out)
		require.Equal(t, 0, b.effects.count(t, "charge"))

		out, err = b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			return b.effects.write(ctx, "charge")
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("PanicRollsBackTheMark", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()

		require.Panics(t, func() {
			_, _ = b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
				require.NoError(t, b.effects.write(ctx, "charge"))
				panic("handler bug")
			})
		})
		out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			return b.effects.write(ctx, "charge")
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("KeysAreDistinct", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		cases := []struct {
			consumer string
			key      framework.Key
		}{
			{consumer, framework.Key{Source: "orders", ID: "1"}},
			{consumer, framework.Key{Source: "payments", ID: "1"}},
			{consumer, framework.Key{Source: "orders", ID: "2"}},
			{"billing.other", framework.Key{Source: "orders", ID: "1"}},
			{consumer, framework.Key{ID: "1"}},
		}
		for _, c := range cases {
			out, err := b.do(ctx, b.uow, c.consumer, c.key, func(ctx context.Context) error { return nil })
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out, "%s %s", c.consumer, c.key)
		}
		for _, c := range cases {
			out, err := b.do(ctx, b.uow, c.consumer, c.key, func(ctx context.Context) error { return nil })
			require.NoError(t, err)
			require.Equal(t, framework.Duplicate, out, "%s %s", c.consumer, c.key)
		}
	})

	t.Run("ConcurrentMarksProcessOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		const workers = 8
		var (
			wg         sync.WaitGroup
			start      = make(chan struct{})
			calls      atomic.Int32
			processed  atomic.Int32
			duplicates atomic.Int32
			errs       = make(chan error, workers)
		)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
					calls.Add(1)
					return b.effects.write(ctx, "charge")
				})
				if err != nil {
					errs <- err
					return
				}
				switch out {
				case framework.Processed:
					processed.Add(1)
				case framework.Duplicate:
					duplicates.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, processed.Load())
		require.EqualValues(t, workers-1, duplicates.Load())
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	// holdMark starts an attempt that holds the mark of key until release
	// is closed, then ends as end says. It returns when the mark is held.
	holdMark := func(t *testing.T, b *bundle, end error, release <-chan struct{}) <-chan error {
		t.Helper()
		held := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			out, err := b.do(context.Background(), b.uow, consumer, key, func(ctx context.Context) error {
				if err := b.effects.write(ctx, "holder"); err != nil {
					return err
				}
				close(held)
				<-release
				return end
			})
			if err == nil && out != framework.Processed {
				err = fmt.Errorf("holder: outcome %s", out)
			}
			done <- err
		}()
		select {
		case <-held:
		case err := <-done:
			t.Fatalf("holder ended before it held the mark: %v", err)
		}
		return done
	}

	type result struct {
		out framework.Outcome
		err error
	}
	// wait starts an attempt on key, which should wait for the holder.
	wait := func(ctx context.Context, b *bundle) <-chan result {
		done := make(chan result, 1)
		go func() {
			out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
				return b.effects.write(ctx, "waiter")
			})
			done <- result{out, err}
		}()
		return done
	}
	requireWaiting := func(t *testing.T, waiter <-chan result) {
		t.Helper()
		select {
		case r := <-waiter:
			t.Fatalf("the waiter did not wait for the holder: %s, %v", r.out, r.err)
		case <-time.After(200 * time.Millisecond):
		}
	}

	t.Run("WaiterClaimsMarkAfterHolderRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, errBoom, release)
		waiter := wait(context.Background(), b)
		requireWaiting(t, waiter)

		close(release)
		require.ErrorIs(t, <-holder, errBoom)
		r := <-waiter
		require.NoError(t, r.err)
		require.Equal(t, framework.Processed, r.out)
		require.Equal(t, 0, b.effects.count(t, "holder"))
		require.Equal(t, 1, b.effects.count(t, "waiter"))
	})

	t.Run("WaiterFindsDuplicateAfterHolderCommits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, nil, release)
		waiter := wait(context.Background(), b)
		requireWaiting(t, waiter)

		close(release)
		require.NoError(t, <-holder)
		r := <-waiter
		require.NoError(t, r.err)
		require.Equal(t, framework.Duplicate, r.out)
		require.Equal(t, 1, b.effects.count(t, "holder"))
		require.Equal(t, 0, b.effects.count(t, "waiter"))
	})

	t.Run("WaiterGivesUpWhenContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, nil, release)
		defer func() {
			close(release)
			require.NoError(t, <-holder)
		}()

		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		select {
		case r := <-wait(ctx, b):
			require.Error(t, r.err)
			require.Equal(t, framework.Failed, r.out)
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not give up when its context ended")
		}
		require.Equal(t, 0, b.effects.count(t, "waiter"))
	})
}

func exerciseDeliveries(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "notifications.remind-on-appointment-booked"
	key := framework.Key{Source: "appointments", ID: "a-1"}

	t.Run("CountIncrementsFromFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for want := 1; want <= 3; want++ {
			n, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
			require.Equal(t, want, n)
		}
		other := framework.Key{Source: "appointments", ID: "a-2"}
		n, err := b.store.Count(ctx, consumer, other, 2)
		require.NoError(t, err)
		require.Equal(t, 2, n, "a new count starts at first")
		n, err = b.store.Count(ctx, consumer, other, 2)
		require.NoError(t, err)
		require.Equal(t, 3, n, "first only starts a new count")
		n, err = b.store.Count(ctx, "notifications.other", key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "counts are per consumer")
	})

	t.Run("ConcurrentCounts", func(t *testing.T) {
		// Counts asked for at once (a store may count them in one
		// statement): each distinct key counts from first, and the
		// counts of one key asked for at once are 1..n, each once.
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		const distinct, repeats = 40, 8
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			got     = make(map[string][]int)
			errs    []error
			hot     = framework.Key{Source: "appointments", ID: "hot"}
			countOf = func(k framework.Key, first int) {
				n, err := b.store.Count(ctx, consumer, k, first)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				got[k.ID] = append(got[k.ID], n)
			}
		)
		for i := range distinct {
			wg.Go(func() { countOf(framework.Key{Source: "appointments", ID: fmt.Sprintf("c-%d", i)}, 1+i%2) })
		}
		for range repeats {
			wg.Go(func() { countOf(hot, 1) })
		}
		wg.Wait()
		require.Empty(t, errs)
		for i := range distinct {
			require.Equal(t, []int{1 + i%2}, got[fmt.Sprintf("c-%d", i)])
		}
		hotCounts := got["hot"]
		slices.Sort(hotCounts)
		require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8}, hotCounts)
	})

	t.Run("CountOddText", func(t *testing.T) {
		// Keys and consumers of text that JSON escapes count as they
		// are, one at a time and at once.
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		keys := []framework.Key{
			{Source: `src "quoted" \ back`, ID: "ctl\x01\t\n line\u2028 <&> \U0001F600"},
			{Source: "appointments", ID: strings.Repeat("long-", 50)},
			{Source: "appointments", ID: "a-1"},
		}
		for _, k := range keys {
			n, err := b.store.Count(ctx, `consumer "odd"`, k, 1)
			require.NoError(t, err)
			require.Equal(t, 1, n, "%q", k)
		}
		var wg sync.WaitGroup
		counts := make([]int, len(keys))
		errs := make([]error, len(keys))
		for i, k := range keys {
			wg.Go(func() { counts[i], errs[i] = b.store.Count(ctx, `consumer "odd"`, k, 1) })
		}
		wg.Wait()
		require.Equal(t, make([]error, len(keys)), errs)
		require.Equal(t, []int{2, 2, 2}, counts)
	})

	// A delivery that the service's stop ended, after an attempt ran to
	// its end, is taken back: it does not count towards the limit.
	t.Run("Uncount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for range 3 {
			_, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
		}
		require.NoError(t, b.store.Uncount(ctx, consumer, key))
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 3, n, "the uncounted delivery was taken back")

		first := framework.Key{Source: "appointments", ID: "a-2"}
		require.NoError(t, b.store.Uncount(ctx, consumer, first))
		n, err = b.store.Count(ctx, consumer, first, 2)
		require.NoError(t, err)
		require.Equal(t, 1, n, "an uncounted first delivery makes its redelivery the first counted")

		zero := framework.Key{Source: "appointments", ID: "a-3"}
		require.NoError(t, b.store.Uncount(ctx, consumer, zero))
		require.NoError(t, b.store.Uncount(ctx, consumer, zero))
		n, err = b.store.Count(ctx, consumer, zero, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "a count never goes below zero")

		n, err = b.store.Count(ctx, "notifications.other", key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "counts are per consumer")
	})

	t.Run("ForgetOnCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n)

		out, err := b.do(pipeline.With(ctx, pipeline.DeliveryCounted(true)), b.uow, consumer, key, func(ctx context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		n, err = b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the committed attempt forgot the count")
	})

	// A dead-lettered message is acknowledged; when an operator replays
	// it, its deliveries are counted afresh, else a message dead-lettered
	// for its delivery limit would be dead-lettered again at once.
	t.Run("DeadLetterForgetsCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for range 3 {
			_, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
		}
		other := framework.Key{Source: "appointments", ID: "a-2"}
		_, err := b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)

		dl := deadLetter(consumer, key.ID)
		dl.Source, dl.Code = key.Source, framework.CodeDeliveryLimit
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))

		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the dead letter took the count with it")
		n, err = b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n, "other counts stay")
	})

	t.Run("RollbackKeepsCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)

		// A failing handler rolls back before the count is forgotten.
		out, err := b.do(pipeline.With(ctx, pipeline.DeliveryCounted(true)), b.uow, consumer, key, func(ctx context.Context) error { return errBoom })
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, framework.Failed, out)
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n)

		if b.h.DB == nil {
			return // without a database nothing can fail after Forget
		}
		// An ack in the transaction fails after Forget ran in it.
		errAck := errors.New("ack")
		ackCtx := pipeline.With(pipeline.With(ctx, pipeline.DeliveryCounted(true)), pipeline.AckInTx{
			DB:  b.h.DB.DB,
			Ack: func(context.Context, pipeline.Execer) error { return errAck },
		})
		out, err = b.do(ackCtx, b.uow, consumer, key, func(ctx context.Context) error { return nil })
		require.ErrorIs(t, err, errAck)
		require.Equal(t, framework.Failed, out)
		n, err = b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 3, n, "the rolled-back Forget kept the count")
	})
}
