package driver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTakeHoldsOnlyTheLaneItTook: a batch that the unordered attempts
// ahead filled up before it reached an attempt of a strict-order lane
// holds no lane, so that the lane's attempt goes in the next batch; and
// a batch frees its lane once it ended.
func TestTakeHoldsOnlyTheLaneItTook(t *testing.T) {
	g := &group{size: 2, batches: 2}
	u1, u2 := &attemptRun{lane: -1}, &attemptRun{lane: -1}
	o1, o2, o3 := &attemptRun{lane: 1}, &attemptRun{lane: 1}, &attemptRun{lane: 0}
	g.waiting = []*attemptRun{u1, u2, o1, o2, o3}

	first := g.take()
	require.Equal(t, []*attemptRun{u1, u2}, first, "the oldest unordered attempts fill the batch")
	require.Zero(t, g.lanes, "a lane none of its attempts is in stays free")

	second := g.take()
	require.Equal(t, []*attemptRun{o1, o2}, second, "lane 1's attempts, in order")
	require.Equal(t, uint64(1<<1), g.lanes)

	third := g.take()
	require.Equal(t, []*attemptRun{o3}, third, "lane 0 runs beside lane 1")
	require.Nil(t, g.take(), "nothing waits")

	g.waiting = []*attemptRun{{lane: 1}}
	require.Nil(t, g.take(), "lane 1 is held by a running batch")
	g.freeLanes(second)
	require.Len(t, g.take(), 1, "lane 1 is free once its batch ended")
}
