package driver

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKnownCheckpoints: an event is at its turn by a committed checkpoint
// only when it is the one right after it; a forgotten or never committed
// checkpoint puts only a first event (#1) at its turn, from 0; past
// maxKnownCheckpoints the checkpoints known are forgotten at once.
func TestKnownCheckpoints(t *testing.T) {
	var k knownCheckpoints
	c, at := k.turn("c", "s", 1)
	require.True(t, at, "nothing committed: #1 is taken to be new")
	require.Zero(t, c)
	_, at = k.turn("c", "s", 2)
	require.False(t, at, "nothing committed")

	k.committed("c", map[string]int64{"s": 4, "t": 1})
	c, at = k.turn("c", "s", 5)
	require.True(t, at)
	require.Equal(t, int64(4), c)
	for _, seq := range []int64{1, 3, 4, 6} {
		_, at := k.turn("c", "s", seq)
		require.False(t, at, "#%d after #4", seq)
	}
	_, at = k.turn("other", "s", 5)
	require.False(t, at, "another consumer's")

	k.forget("c", []string{"s"})
	_, at = k.turn("c", "s", 5)
	require.False(t, at, "forgotten")
	_, at = k.turn("c", "t", 2)
	require.True(t, at, "the others stay")

	many := make(map[string]int64, maxKnownCheckpoints)
	for i := range maxKnownCheckpoints {
		many[strconv.Itoa(i)] = 1
	}
	k.committed("c", many)
	require.LessOrEqual(t, len(k.seqs), maxKnownCheckpoints)
	_, at = k.turn("c", "t", 2)
	require.False(t, at, "forgotten with the rest once full")
}

// TestPlanMoves: a subject whose first event in the batch follows the
// checkpoint its process committed moves to the last of the run of its
// events that follow one another from it (a repeat, or an event past a
// gap, does not extend the run); a subject whose first event does not
// follow it is read and locked instead. A subject the process knows
// nothing of moves from 0 when its first event in the batch is #1.
func TestPlanMoves(t *testing.T) {
	g := &group{}
	g.known.committed("c", map[string]int64{"a": 4, "b": 2, "d": 7})
	ev := func(subject string, seq int64) *attemptRun {
		return &attemptRun{consumer: "c", delivery: Delivery{OrderedSubject: subject, OrderedSeq: seq}}
	}
	batch := []*attemptRun{
		ev("a", 5), ev("b", 4), ev("a", 6), ev("a", 6), ev("a", 8), ev("a", 7), ev("e", 1), ev("d", 8), ev("f", 2), ev("e", 2),
		{consumer: "c"}, // unordered
	}
	planned, from, unknown := g.planMoves(batch, []string{"a", "b", "e", "d", "f"})
	require.Equal(t, plannedMoves{"a": 7, "d": 8, "e": 2}, planned, "#8 of a waits: it came before #7")
	require.Equal(t, plannedMoves{"a": 4, "d": 7, "e": 0}, from)
	require.Equal(t, []string{"b", "f"}, unknown)

	planned, _, unknown = g.planMoves(batch[1:2], []string{"b"})
	require.Nil(t, planned, "no subject at its turn")
	require.Equal(t, []string{"b"}, unknown)
}
