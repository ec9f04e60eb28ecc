package amqp

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// broker settles frames as RabbitMQ does on one channel: a tag must be
// unacknowledged (else it closes the channel: here, an error), and a
// multiple ack settles every unacknowledged tag up to its own.
type broker struct {
	unacked map[uint64]bool
	acked   map[uint64]int
	nacked  map[uint64]int
	frames  []string
}

func newBroker(n int) *broker {
	b := &broker{unacked: map[uint64]bool{}, acked: map[uint64]int{}, nacked: map[uint64]int{}}
	for tag := uint64(1); tag <= uint64(n); tag++ {
		b.unacked[tag] = true
	}
	return b
}

func (b *broker) Ack(tag uint64, multiple bool) error {
	b.frames = append(b.frames, fmt.Sprintf("ack %d %v", tag, multiple))
	if !b.unacked[tag] {
		return fmt.Errorf("PRECONDITION_FAILED - unknown delivery tag %d", tag)
	}
	for t := range b.unacked {
		if t == tag || multiple && t < tag {
			delete(b.unacked, t)
			b.acked[t]++
		}
	}
	return nil
}

func (b *broker) Nack(tag uint64, multiple, requeue bool) error {
	b.frames = append(b.frames, fmt.Sprintf("nack %d %v %v", tag, multiple, requeue))
	if !b.unacked[tag] || multiple || !requeue {
		return fmt.Errorf("unexpected nack of %d", tag)
	}
	delete(b.unacked, tag)
	b.nacked[tag]++
	return nil
}

// checked fails the test on the first frame the broker refuses.
type checked struct {
	t *testing.T
	b *broker
}

func (c checked) Ack(tag uint64, multiple bool) error {
	c.t.Helper()
	require.NoError(c.t, c.b.Ack(tag, multiple))
	return nil
}

func (c checked) Nack(tag uint64, multiple, requeue bool) error {
	c.t.Helper()
	require.NoError(c.t, c.b.Nack(tag, multiple, requeue))
	return nil
}

// burst applies events as run does when they wait together, then flushes.
func burst(a *acker, events ...ackEvent) {
	for _, ev := range events {
		a.apply(ev)
	}
	a.flush(false)
}

func ack(tag uint64) ackEvent  { return ackEvent{tag: tag, op: opAck} }
func nack(tag uint64) ackEvent { return ackEvent{tag: tag, op: opNack} }
func add(tag uint64) ackEvent  { return ackEvent{tag: tag, op: opAdd} }

// TestAckerCoalesces: a burst of acks at the front of the deliveries
// handed out goes out as one multiple ack; an ack behind an unsettled
// delivery goes out alone at once; a nack goes out at once and a later
// multiple ack steps over it.
func TestAckerCoalesces(t *testing.T) {
	b := newBroker(6)
	a := newAcker(checked{t, b}, 8, 0)
	burst(a, add(1), add(2), add(3), add(4), add(5), add(6))
	burst(a, ack(3))
	require.Equal(t, []string{"ack 3 false"}, b.frames, "behind 1 and 2, unsettled: alone, not held back")
	burst(a, ack(2), ack(1))
	burst(a, ack(4), nack(5))
	burst(a, ack(6))
	require.Equal(t, []string{
		"ack 3 false",
		"ack 2 true", // 1 and 2 in one frame; 3 was acked already
		"nack 5 false true",
		"ack 4 true",
		"ack 6 true",
	}, b.frames)
	require.Empty(t, b.unacked)
	require.Empty(t, a.pending)
}

// TestAckerSettlesEachOnce: whatever the order and grouping of the
// settlements, every delivery is settled once, as it was settled, no
// frame names a tag the broker no longer holds, and no delivery takes
// more than one frame.
func TestAckerSettlesEachOnce(t *testing.T) {
	for seed := range uint64(400) {
		r := rand.New(rand.NewPCG(seed, 1))
		const n = 64
		b := newBroker(n)
		a := newAcker(checked{t, b}, 2*n, int(seed%2)*8) // every other seed holds acks
		var events []ackEvent
		wantNack := map[uint64]bool{}
		order := r.Perm(n)
		added := 0
		for _, i := range order {
			tag := uint64(i + 1)
			for uint64(added) < tag { // handed out in tag order, before settling
				added++
				events = append(events, add(uint64(added)))
			}
			if r.IntN(10) == 0 {
				wantNack[tag] = true
				events = append(events, nack(tag))
			} else {
				events = append(events, ack(tag))
			}
		}
		for len(events) > 0 {
			k := min(len(events), 1+r.IntN(20))
			burst(a, events[:k]...)
			events = events[k:]
		}
		a.flush(true) // as run does at the end
		require.Empty(t, b.unacked, "seed %d: every delivery settled", seed)
		for tag := uint64(1); tag <= n; tag++ {
			if wantNack[tag] {
				require.Equal(t, 1, b.nacked[tag], "seed %d: tag %d nacked once", seed, tag)
				require.Zero(t, b.acked[tag], "seed %d: tag %d", seed, tag)
			} else {
				require.Equal(t, 1, b.acked[tag], "seed %d: tag %d acked once", seed, tag)
				require.Zero(t, b.nacked[tag], "seed %d: tag %d", seed, tag)
			}
		}
		require.LessOrEqual(t, len(b.frames), n, "seed %d: never more than a frame per delivery", seed)
	}
}

// TestAckerHolds: an ack behind an unsettled delivery waits for the
// multiple ack of the front, up to holdMax acks and holdFor; past either,
// the held acks go out one by one; at the end, every held one does.
func TestAckerHolds(t *testing.T) {
	b := newBroker(12)
	a := newAcker(checked{t, b}, 16, 3)
	clock := time.Unix(0, 0)
	a.now = func() time.Time { return clock }
	burst(a, add(1), add(2), add(3), add(4), add(5), add(6), add(7), add(8), add(9), add(10), add(11), add(12))

	burst(a, ack(3), ack(2))
	require.Empty(t, b.frames, "behind 1, unsettled: held")
	burst(a, ack(1))
	require.Equal(t, []string{"ack 3 true"}, b.frames, "1 to 3 in one frame")

	b.frames = nil
	burst(a, ack(5), ack(6), ack(7))
	require.Empty(t, b.frames, "three behind 4: held")
	burst(a, ack(8))
	require.Equal(t, []string{"ack 5 false", "ack 6 false", "ack 7 false", "ack 8 false"}, b.frames, "a fourth is more than holdMax: each goes")

	b.frames = nil
	burst(a, ack(10))
	due := a.flush(false)
	require.Equal(t, clock.Add(ackHoldFor), due, "held until holdFor passed")
	clock = clock.Add(ackHoldFor)
	require.True(t, a.flush(false).IsZero())
	require.Equal(t, []string{"ack 10 false"}, b.frames, "held for holdFor: it goes")

	b.frames = nil
	burst(a, ack(12), nack(11))
	require.Equal(t, []string{"nack 11 false true"}, b.frames, "a nack goes at once; 12 is held behind 4 and 9")
	a.flush(true)
	require.Equal(t, []string{"nack 11 false true", "ack 12 false"}, b.frames, "at the end every held ack goes")
	burst(a, ack(4), ack(9))
	require.Empty(t, b.unacked)
}
