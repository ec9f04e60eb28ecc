package middleware_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// TestGuardSuspectsOneAtATime: redeliveries (suspects, one of them may
// have killed the process) pass the delivery guard one at a time, and one
// waiting for its turn is not counted: when its context ends it is nacked
// with its count unchanged.
func TestGuardSuspectsOneAtATime(t *testing.T) {
	t.Parallel()
	sqliteBackend := backends[0]
	require.Equal(t, "SQLite", sqliteBackend.name)
	ctx := context.Background()

	var (
		in1      = make(chan struct{})    // 1 passed the guard
		release1 = make(chan struct{})    // lets 1 go on
		out1     = make(chan struct{})    // 1's steps inside the guard returned
		overlap  = make(chan string, 100) // ids that passed the guard while 1 ran
	)
	// The first Outer step runs right after the guard, in the suspect's
	// turn and outside the attempt's transaction (SQLite has one writer:
	// a transaction held open would hold up the others' counts too).
	probe := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, _ := framework.EnvelopeFromContext(msg.Context())
			if d.ID == "1" {
				close(in1)
				<-release1
				defer close(out1)
				return next(msg)
			}
			select {
			case <-out1:
			default:
				overlap <- d.ID
			}
			return next(msg)
		}
	}
	bd := setup(t, sqliteBackend, setupConfig{outer: []message.HandlerMiddleware{probe}})
	redeliver := func(ctx context.Context, id string) error {
		msg := message.NewMessage(watermill.NewUUID(), event(t, "notes", id))
		msg.Metadata.Set(framework.MetadataRedelivered, "true")
		msg.SetContext(ctx)
		return bd.handler(msg)
	}
	countOf := func(id string) int {
		return bd.count(t, `SELECT COALESCE(MAX(count), 0) FROM deliveries WHERE consumer = ? AND source = ? AND event_id = ?`, consumerName, "notes", id)
	}

	var (
		wg         sync.WaitGroup
		err1, err2 error
	)
	let1Go := sync.OnceFunc(func() { close(release1) })
	t.Cleanup(func() { // after a failed check too: no goroutine left behind
		let1Go()
		wg.Wait()
	})
	wg.Go(func() { err1 = redeliver(ctx, "1") })
	<-in1
	wg.Go(func() { err2 = redeliver(ctx, "2") })

	// 3 was counted twice before (say, by two crashed processes). It waits
	// behind 1 until its context ends, as on shutdown.
	n, err := bd.store.Count(ctx, consumerName, framework.Key{Source: "notes", ID: "3"}, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	ctx3, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err = redeliver(ctx3, "3")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a suspect whose context ends while it waits is nacked")
	require.Equal(t, 2, countOf("3"), "a suspect waiting for its turn is not counted")
	require.Empty(t, bd.deadLetters(t))

	let1Go()
	wg.Wait()
	require.NoError(t, err1)
	require.NoError(t, err2)
	close(overlap)
	for id := range overlap {
		t.Errorf("redelivered %s passed the guard while redelivered 1 was handled", id)
	}
	require.Equal(t, 2, bd.effects(t))

	require.NoError(t, redeliver(ctx, "3"), "the nacked suspect is handled when it comes back")
	require.Equal(t, 3, bd.effects(t))
	require.Zero(t, countOf("3"), "the count is forgotten with the commit")
}
