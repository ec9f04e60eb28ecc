package middleware_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
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
// attempts again alone, so that the replay releases them, in order. A
// batch whose events follow the checkpoints its process committed moves
// them in the statement that marks its events, before its handlers run,
// and only if no other process moved them meanwhile.
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

	// Another process took M0 and M1 on to #4 meanwhile: the checkpoints
	// this process committed, #3, are behind. Other events claiming their
	// #4, at their turn by what this process knows, are stale by the
	// store's: the batch's moves of their checkpoints from #3 fail, and
	// its attempts run again alone. They take no effect, and the other
	// subjects' #4 still do.
	_, err = o.db.Exec(`UPDATE subject_checkpoints SET seq = 4 WHERE consumer = $1 AND subject IN ('M0', 'M1')`, consumerName)
	require.NoError(t, err)
	outcomes := make([]framework.Outcome, 8)
	var fourth sync.WaitGroup
	for s := range 8 {
		fourth.Go(func() { outcomes[s] = deliver(t, h, fmt.Sprintf("m%d-4", s), fmt.Sprintf("M%d", s), 4) })
	}
	fourth.Wait()
	require.Equal(t, framework.Stale, outcomes[0], "M0's #4 by another process")
	require.Equal(t, framework.Stale, outcomes[1], "M1's #4 by another process")
	for s := 2; s < 8; s++ {
		require.Equal(t, framework.Processed, outcomes[s], "M%d's #4", s)
	}
	require.Equal(t, []string{"m0-1", "m0-2", "m0-3"}, o.applied(t, "m0-"))
	require.Equal(t, []string{"m1-1", "m1-2", "m1-3"}, o.applied(t, "m1-"))
	require.Equal(t, []string{"m2-1", "m2-2", "m2-3", "m2-4"}, o.applied(t, "m2-"))

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

// TestStrictOrderFirstEventsMove: a process that knows nothing of a
// subject (it just started) takes an event #1 to be the subject's first
// and moves its checkpoint from 0 in the statement that marks the batch's
// events. Where the subject is not new (a copy of an old #1 after a
// restart), the move's compare fails, the batch's attempts run again
// alone, the copy takes no effect and the checkpoint stays; the new
// subjects' first events take effect, and the old subject's next event
// after them.
func TestStrictOrderFirstEventsMove(t *testing.T) {
	t.Parallel()
	b := backends[1]
	require.Equal(t, "Postgres", b.name)
	o := newOrdered(t, b)
	lingering := func() message.NoPublishHandlerFunc {
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: o.db, Store: o.store, Linger: 200 * time.Millisecond})
		require.NoError(t, err)
		o.uow = uow
		return o.handler(t, o.store)
	}
	at := func(h message.NoPublishHandlerFunc, events map[string]framework.Outcome) {
		var wg sync.WaitGroup
		for id, want := range events {
			wg.Go(func() {
				subject, n := id[:2], int64(id[len(id)-1]-'0')
				assert.Equal(t, want, deliver(t, h, id, subject, n), id) // not require: off the test's goroutine
			})
		}
		wg.Wait()
	}
	checkpoints := func() map[string]int64 {
		var rows []struct {
			Subject string
			Seq     int64
		}
		require.NoError(t, o.db.Select(&rows, `SELECT subject, seq FROM subject_checkpoints WHERE consumer = $1`, consumerName))
		m := make(map[string]int64, len(rows))
		for _, r := range rows {
			m[r.Subject] = r.Seq
		}
		return m
	}

	first := lingering()
	at(first, map[string]framework.Outcome{"A0-1": framework.Processed, "A1-1": framework.Processed, "A2-1": framework.Processed})
	at(first, map[string]framework.Outcome{"A0-2": framework.Processed, "A1-2": framework.Processed, "A2-2": framework.Processed})
	require.Equal(t, map[string]int64{"A0": 2, "A1": 2, "A2": 2}, checkpoints())

	// Eight events at once, into the lingering batches: the old #1s
	// share them with the new subjects' first events.
	restarted := lingering()
	at(restarted, map[string]framework.Outcome{
		"A0-copy-1": framework.Stale, // old #1s under other ids
		"A1-copy-1": framework.Stale,
		"A2-copy-1": framework.Stale,
		"B0-1":      framework.Processed,
		"B1-1":      framework.Processed,
		"B2-1":      framework.Processed,
		"B3-1":      framework.Processed,
		"B4-1":      framework.Processed,
	})
	require.Equal(t, map[string]int64{"A0": 2, "A1": 2, "A2": 2, "B0": 1, "B1": 1, "B2": 1, "B3": 1, "B4": 1}, checkpoints())
	at(restarted, map[string]framework.Outcome{"A0-3": framework.Processed, "B0-2": framework.Processed, "B1-2": framework.Processed})
	require.Equal(t, []string{"A0-1", "A0-2", "A0-3"}, o.applied(t, "A0"))
	require.Equal(t, []string{"B0-1", "B0-2"}, o.applied(t, "B0"))
	require.Equal(t, map[string]int64{"A0": 3, "A1": 2, "A2": 2, "B0": 2, "B1": 2, "B2": 1, "B3": 1, "B4": 1}, checkpoints())
	dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	require.Empty(t, dls, "no event dead-lettered")
}
