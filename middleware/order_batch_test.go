package middleware_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// TestStrictOrderBatchedSteps: on PostgreSQL, a batch of strict-order
// attempts of several subjects reads their checkpoints in one statement
// and moves them in one before its commit (driver.Delivery.OrderedSubject).
// Events of many subjects, delivered at once into lingering batches, take
// effect in order with their checkpoints moved; and a batch in which one
// subject has parked events behind a dead letter being replayed runs its
// attempts again alone, so that the replay releases them, in order.
func TestStrictOrderBatchedSteps(t *testing.T) {
	t.Parallel()
	b := backends[1]
	require.Equal(t, "Postgres", b.name)
	o := newOrdered(t, b)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: o.db, Store: o.store, Linger: 200 * time.Millisecond})
	require.NoError(t, err)
	o.uow = uow
	h := o.handler(t, o.store)

	at := func(n int64) {
		var wg sync.WaitGroup
		for s := range 8 {
			wg.Go(func() {
				id := fmt.Sprintf("m%d-%d", s, n)
				require.Equal(t, framework.Processed, deliver(t, h, id, fmt.Sprintf("M%d", s), n), id)
			})
		}
		wg.Wait()
	}
	for n := int64(1); n <= 3; n++ {
		at(n)
	}
	var moved int
	require.NoError(t, o.db.Get(&moved, `SELECT count(*) FROM subject_checkpoints WHERE consumer = $1 AND subject LIKE 'M%' AND seq = 3`, consumerName))
	require.Equal(t, 8, moved, "every subject's checkpoint at its last step")

	dl := o.parkBehindDeadLetter(t, h)
	var wg sync.WaitGroup
	for _, subject := range []string{"T", "U"} {
		wg.Go(func() {
			id := fmt.Sprintf("%s1", subject)
			require.Equal(t, framework.Processed, deliver(t, h, id, subject, 1), id)
		})
	}
	require.Equal(t, framework.Processed, redeliver(t, h, dl))
	wg.Wait()
	require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"), "each once, in order")
	require.Empty(t, o.parked(t))
	require.Equal(t, []string{"T1"}, o.applied(t, "T"))
	require.Equal(t, []string{"U1"}, o.applied(t, "U"))
}
