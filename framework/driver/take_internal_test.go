package driver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// ordered returns an attempt of consumer's strict-order subject, in lane.
func ordered(consumer, subject string, lane int) *attemptRun {
	a := &attemptRun{consumer: consumer, lane: lane}
	a.delivery.OrderedSubject = subject
	return a
}

// TestTakeHoldsTheSubjectsItTook: a batch takes the unordered attempts and
// those of one free lane first, then fills up with those of the other
// lanes' subjects that no running batch holds, and holds the subjects it
// took until it ended: a subject's attempts behind a running batch's wait
// for it, the other subjects' go beside it.
func TestTakeHoldsTheSubjectsItTook(t *testing.T) {
	g := &group{size: 3, batches: 2}
	u1 := &attemptRun{lane: -1}
	a1, a2, a3 := ordered("c", "a", 1), ordered("c", "a", 1), ordered("c", "a", 1)
	b1, c1 := ordered("c", "b", 0), ordered("c", "c", 1)
	g.waiting = []*attemptRun{u1, a1, b1, a2, c1}

	first := g.take()
	require.Equal(t, []*attemptRun{u1, a1, a2}, first, "the oldest unordered attempts and lane 1's, in order")
	require.Equal(t, uint64(1<<1), g.lanes)

	second := g.take()
	require.Equal(t, []*attemptRun{b1, c1}, second, "lane 0's attempts, then lane 1's of a subject no batch holds")
	require.Equal(t, uint64(1<<0|1<<1), g.lanes)
	require.Len(t, g.held, 3)

	g.waiting = []*attemptRun{a3}
	require.Nil(t, g.take(), "a is held by a running batch")

	other := ordered("d", "a", 1)
	g.waiting = append(g.waiting, other)
	require.Equal(t, []*attemptRun{other}, g.take(), "another consumer's subject of the same name is not held")

	g.freeSubjects(second)
	require.Equal(t, uint64(1<<1), g.lanes, "the batch frees the lane it took, not the lane of the attempts it filled up with")
	require.Nil(t, g.take(), "a is still held")
	g.freeSubjects(first)
	require.Equal(t, []*attemptRun{a3}, g.take(), "a is free once its batch ended")
}

// TestTakeHoldsNoSubjectItDidNotTake: a batch that the attempts ahead
// filled up before it reached an attempt of a subject holds neither the
// subject nor its lane, so that the subject's attempts go in the next
// batch, together and in order.
func TestTakeHoldsNoSubjectItDidNotTake(t *testing.T) {
	g := &group{size: 2, batches: 2}
	u1, u2 := &attemptRun{lane: -1}, &attemptRun{lane: -1}
	a1, a2 := ordered("c", "a", 1), ordered("c", "a", 1)
	g.waiting = []*attemptRun{u1, u2, a1, a2}

	require.Equal(t, []*attemptRun{u1, u2}, g.take())
	require.Empty(t, g.held, "a subject none of its attempts is in stays free")
	require.Zero(t, g.lanes, "a lane none of its attempts is in stays free")
	require.Equal(t, []*attemptRun{a1, a2}, g.take(), "one subject's attempts share a batch, in order")
}
