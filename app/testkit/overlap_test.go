package testkit_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
)

// TestOutsideCallsOverlapByDefault: at the default configuration (group
// commit), the attempts of one consumer whose handler waits 50 ms outside
// the database, as an HTTP call does, overlap in time on PostgreSQL
// instead of running one after another in a batch; each event takes
// effect once. A first event, delivered alone, teaches the consumer where
// its handlers' time goes (on a loaded machine, events delivered together
// could all join the first batch before any attempt ended); the ones
// delivered together after it then run at once, each in a transaction of
// its own.
func TestOutsideCallsOverlapByDefault(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kit := testkit.New(t, testkit.Config{PostgresURL: postgresURL(t), Migrations: migrations})
	type span struct{ start, end time.Time }
	var (
		mu    sync.Mutex
		spans []span
	)
	c := kit.Chain(t, consumerName, framework.Handle(Booked, func(ctx context.Context, ev framework.Event[BookedV1]) error {
		start := time.Now()
		time.Sleep(50 * time.Millisecond) // the outside call
		_, err := framework.Conn(ctx, kit.DB()).ExecContext(ctx,
			kit.DB().Rebind(`INSERT INTO reminders (appointment_id, starts_at) VALUES (?, ?)`),
			ev.Data.AppointmentID, ev.Data.StartsAt)
		mu.Lock()
		spans = append(spans, span{start, time.Now()})
		mu.Unlock()
		return err
	}))

	for _, res := range c.DeliverTogether(ctx, t, booked(t, "first")) {
		testkit.RequireProcessed(t, res)
	}
	mu.Lock()
	spans = nil
	mu.Unlock()
	envs := make([]framework.Envelope, 8)
	for i := range envs {
		envs[i] = booked(t, fmt.Sprint(i))
	}
	for _, res := range c.DeliverTogether(ctx, t, envs...) {
		testkit.RequireProcessed(t, res)
	}
	require.Equal(t, len(envs)+1, reminders(t, kit), "each effect once")

	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	overlapping := 0
	for i := 1; i < len(spans); i++ {
		if spans[i].start.Before(spans[i-1].end) {
			overlapping++
		}
	}
	require.Positive(t, overlapping, "the handlers' waits overlap: %v", spans)
}
