package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/middleware"
)

// gapChain is a strict-order consumer (see ordered) whose chain and
// store share a clock that the test moves.
type gapChain struct {
	*ordered
	h     message.NoPublishHandlerFunc
	sweep func(context.Context) // the chain's sweep (Handler), not running
	later atomic.Int64          // nanoseconds the clock is ahead of the system's
}

func newGapChain(t *testing.T, b backend) *gapChain {
	t.Helper()
	return newGapChainSweeping(t, b, 0)
}

// newGapChainSweeping is newGapChain whose sweep runs every releaseSweep
// (0: DefaultReleaseSweep).
func newGapChainSweeping(t *testing.T, b backend, releaseSweep time.Duration) *gapChain {
	t.Helper()
	return newGapChainOn(t, b, releaseSweep, nil)
}

// newGapChainOn is newGapChainSweeping whose chain has the store that wrap
// makes of the database's (nil: the store itself).
func newGapChainOn(t *testing.T, b backend, releaseSweep time.Duration, wrap func(driver.Store) driver.Store) *gapChain {
	t.Helper()
	g := &gapChain{}
	now := func() time.Time { return time.Now().Add(time.Duration(g.later.Load())) }
	db, s := b.open(t, now)
	g.ordered = newOrderedOn(t, db, s)
	chainStore := s
	if wrap != nil {
		chainStore = wrap(s)
	}
	var err error
	g.h, g.sweep, err = middleware.HandlerWithSweepOnClock(middleware.Config{
		Consumer: g.c, UnitOfWork: g.uow, Store: chainStore, Settings: middleware.Settings{
			StrictOrder: true,
			GapTimeout:  time.Hour,
		},
	}, middleware.TestClock{Now: now, ReleaseSweep: releaseSweep})
	require.NoError(t, err)
	return g
}

// parkS3 takes s1 of subject S, then s3, which waits for s2 (nacked), and
// once it has waited GapPark, parks it.
func (g *gapChain) parkS3(t *testing.T) {
	t.Helper()
	_, err := g.deliver(t, "s1", "S", 1)
	require.NoError(t, err)
	_, err = g.deliver(t, "s3", "S", 3)
	require.ErrorIs(t, err, pipeline.ErrLater)
	g.later.Add(int64(middleware.GapPark))
	out, err := g.deliver(t, "s3", "S", 3)
	require.NoError(t, err)
	require.Equal(t, framework.Parked, out)
}

// deliver hands an event of subject with sequence n to the chain and
// returns what became of it, and the chain's error.
func (g *gapChain) deliver(t *testing.T, id, subject string, n int64) (framework.Outcome, error) {
	t.Helper()
	env, err := noted.Envelope(noteV1{Text: id}, framework.Attributes{ID: id, Source: "notes", Subject: subject, SubjectSeq: n})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), body(t, env))
	err = g.h(msg)
	r, _ := middleware.ReportOf(msg)
	return r.Outcome, err
}

func (g *gapChain) reasons(t *testing.T) []string {
	t.Helper()
	var rs []string
	require.NoError(t, g.db.Select(&rs, `SELECT event_id || ' ' || reason FROM parked_events ORDER BY seq`))
	return rs
}

// TestStrictOrderParksALongWait: an event that waits for an earlier one
// of its subject is nacked at first; once it has waited GapPark it is
// parked (acknowledged, its message kept) instead, so that waiting events
// do not fill what the transport hands out and keep back the events they
// wait for; its predecessor's effect applies it at once.
func TestStrictOrderParksALongWait(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			g := newGapChain(t, b)
			out, err := g.deliver(t, "s1", "S", 1)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
			out, err = g.deliver(t, "s3", "S", 3)
			require.ErrorIs(t, err, pipeline.ErrLater, "s3 waits for s2: nacked")
			require.Equal(t, framework.Nacked, out)
			require.Equal(t, []string{"s3 gap"}, g.reasons(t))

			g.later.Add(int64(middleware.GapPark))
			out, err = g.deliver(t, "s3", "S", 3)
			require.NoError(t, err, "s3 waited GapPark: acknowledged")
			require.Equal(t, framework.Parked, out)
			require.Equal(t, []string{"s3 parked"}, g.reasons(t))
			require.False(t, g.marked(t, "s3"))
			require.Equal(t, []string{"s1"}, g.applied(t, "s"))

			out, err = g.deliver(t, "s2", "S", 2)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
			require.Equal(t, []string{"s1", "s2", "s3"}, g.applied(t, "s"), "s2's effect applied the parked s3")
			require.Empty(t, g.reasons(t))
			var c int64
			require.NoError(t, g.db.Get(&c, `SELECT seq FROM subject_checkpoints WHERE subject = 'S'`))
			require.Equal(t, int64(3), c)
		})
	}
}

// TestStrictOrderParkedGapTimeout: an event parked while it waits for an
// earlier one that never comes is dead-lettered with code sequence_gap
// once it has waited longer than GapTimeout, from the start of its wait,
// by the consumer's sweep; a later event is then parked no more behind it.
func TestStrictOrderParkedGapTimeout(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			g := newGapChain(t, b)
			g.parkS3(t) // s1 runs the sweep after start

			g.later.Add(int64(59 * time.Minute))
			_, err := g.deliver(t, "o1", "O", 1) // another subject's message runs the next sweep
			require.NoError(t, err)
			require.Equal(t, []string{"s3 parked"}, g.reasons(t), "not an hour yet")

			g.later.Add(int64(2 * time.Minute))
			_, err = g.deliver(t, "o2", "O", 2)
			require.NoError(t, err)
			require.Empty(t, g.reasons(t))
			dls, err := g.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			require.Equal(t, "s3", dls[0].EventID)
			require.Equal(t, framework.CodeSequenceGap, dls[0].Code)
			require.Equal(t, []string{"s1"}, g.applied(t, "s"))
		})
	}
}

// TestStrictOrderParkedGapTimeoutKeepsTheEvent: a parked event whose
// wait ended (sequence_gap) but whose dead letter could not be stored (the
// database went away, or the process died on the way) stays parked: its
// parking is the only copy of its message. The next sweep dead-letters
// it.
func TestStrictOrderParkedGapTimeoutKeepsTheEvent(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			failing := &failingDeadLetter{id: "s3"}
			g := newGapChainOn(t, b, 0, func(s driver.Store) driver.Store {
				failing.Store = s
				return failing
			})
			g.parkS3(t)
			var parked []byte
			require.NoError(t, g.db.Get(&parked, `SELECT body FROM parked_events WHERE event_id = 's3'`))

			g.later.Add(int64(61 * time.Minute))
			_, err := g.deliver(t, "o1", "O", 1) // its sweep hands s3 to the chain
			require.NoError(t, err)
			require.Equal(t, []string{"s3 parked"}, g.reasons(t), "s3 is not lost")
			dls, err := g.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
			require.NoError(t, err)
			require.Empty(t, dls)

			failing.id = ""
			g.later.Add(int64(2 * middleware.DefaultReleaseSweep))
			_, err = g.deliver(t, "o2", "O", 2)
			require.NoError(t, err)
			require.Empty(t, g.reasons(t))
			dls, err = g.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			require.Equal(t, "s3", dls[0].EventID)
			require.Equal(t, framework.CodeSequenceGap, dls[0].Code)
			require.Equal(t, parked, dls[0].Body, "the parked message, whole")
		})
	}
}

// TestStrictOrderIdleSweepEndsTheWait: a consumer that receives nothing
// more still ends a parked event's wait for an earlier one that never
// comes: Handler's sweep, running on its own, hands it to the
// chain once it has waited longer than GapTimeout, and it is
// dead-lettered as sequence_gap. Before, only the consumer's next message
// ran the sweep.
func TestStrictOrderIdleSweepEndsTheWait(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			g := newGapChainSweeping(t, b, 40*time.Millisecond)
			g.parkS3(t)

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); g.sweep(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			time.Sleep(200 * time.Millisecond) // sweeps run, the wait is short yet
			require.Equal(t, []string{"s3 parked"}, g.reasons(t), "not an hour yet")

			g.later.Add(int64(time.Hour)) // no message comes meanwhile
			require.Eventually(t, func() bool {
				dls, err := g.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
				return err == nil && len(dls) == 1 && dls[0].EventID == "s3" && dls[0].Code == framework.CodeSequenceGap
			}, 10*time.Second, 20*time.Millisecond, "the idle sweep dead-letters s3 as sequence_gap")
			require.Empty(t, g.reasons(t))
			require.Equal(t, []string{"s1"}, g.applied(t, "s"))

			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the sweep did not return once its context ended")
			}
		})
	}
}

// TestStrictOrderSecondEventOfOneSequenceBehindAGap: s3 is parked behind
// a gap; another event with #3 neither parks in its place (the parked row
// is s3's only copy) nor waits for ever: it is a sequence_conflict dead
// letter once it has waited GapPark too, and s3 still takes effect after
// s2.
func TestStrictOrderSecondEventOfOneSequenceBehindAGap(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			g := newGapChain(t, b)
			g.parkS3(t)
			out, err := g.deliver(t, "s3-again", "S", 3)
			require.NoError(t, err)
			require.Equal(t, framework.DeadLettered, out)
			dls := g.deadLetters(t, "s3-again")
			require.Len(t, dls, 1)
			require.Equal(t, framework.CodeSequenceConflict, dls[0].Code)
			require.Equal(t, []string{"s3 parked"}, g.reasons(t), "s3 keeps its place and its message")

			out, err = g.deliver(t, "s2", "S", 2)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
			require.Equal(t, []string{"s1", "s2", "s3"}, g.applied(t, "s"))
			require.Empty(t, g.reasons(t))
		})
	}
}
