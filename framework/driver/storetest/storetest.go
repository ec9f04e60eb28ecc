package storetest

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
	NewStore func(t *testing.T, cfg Config) driver.Store
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
	t.Run("Leases", func(t *testing.T) {
		t.Parallel()
		exerciseLeases(t, newHarness)
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
	store   driver.Store
	uow     *driver.UnitOfWork
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
func (b *bundle) open(t *testing.T, prefix string) (driver.Store, *driver.UnitOfWork) {
	t.Helper()
	s := b.h.NewStore(t, Config{TablePrefix: prefix, Now: b.clock.Now})
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.h.DB, Store: s})
	require.NoError(t, err)
	return s, uow
}

// do runs fn in uow and counts the effects fn wrote when the unit of work
// committed them.
func (b *bundle) do(ctx context.Context, uow *driver.UnitOfWork, consumer string, key framework.Key, fn func(ctx context.Context) error) (framework.Outcome, error) {
	return b.effects.do(ctx, uow, consumer, key, driver.Delivery{}, fn)
}

// doDelivery is do for the delivery d (see driver.UnitOfWork.DoDelivery).
func (b *bundle) doDelivery(ctx context.Context, uow *driver.UnitOfWork, consumer string, key framework.Key, d driver.Delivery, fn func(ctx context.Context) error) (framework.Outcome, error) {
	return b.effects.do(ctx, uow, consumer, key, d, fn)
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

func (e *effects) do(ctx context.Context, uow *driver.UnitOfWork, consumer string, key framework.Key, d driver.Delivery, fn func(ctx context.Context) error) (framework.Outcome, error) {
	var pending []string
	out, err := uow.DoDelivery(context.WithValue(ctx, pendingKey{}, &pending), consumer, key, d, fn)
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
	if _, ok := driver.TxFromContext(ctx); !ok {
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
