package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReadAheadWhileQueued shows that a busy subscription reads its next
// rows while rows are still queued, once fewer are than its concurrency
// and its window has room for half a batch: it used to wait until the queue ran dry and the window's head
// was acknowledged, so that each place in flight freed meanwhile stayed
// empty for the read's round trip (a partitioned consumer's process,
// whose handlers wait outside the database, kept 13 of its 16 places
// busy on average instead of 15.8).
func TestReadAheadWhileQueued(t *testing.T) {
	const concurrency, batch = 4, 8
	sub := &subscription{
		s:    &subscriber{concurrency: concurrency, cfg: TransportConfig{BatchSize: batch}},
		sent: make(map[*delivery]struct{}),
	}
	st := &stream{locked: true}
	sub.streams = []*stream{st}
	fill := func(inFlight, queued int) {
		st.window, sub.queue = nil, nil
		clear(sub.sent)
		for i := range inFlight + queued {
			r := &row{st: st, pos: position{xid: 1, offset: int64(i)}}
			st.window = append(st.window, r)
			if i < inFlight {
				sub.sent[&delivery{r: r}] = struct{}{}
			} else {
				r.queued = true
				sub.queue = append(sub.queue, r)
			}
		}
	}
	now := time.Now()

	// Every place in flight, two rows queued: the window (6 of 12) has
	// room for half a batch, so the next rows are read now.
	fill(concurrency, 2)
	require.True(t, sub.readDue(now), "a read waits for the queue to run dry")

	// A window with room for less than half a batch waits for more
	// acknowledgements, queued rows or not.
	fill(concurrency, 5)
	require.False(t, sub.readDue(now), "a read of fewer than half a batch while busy")

	// While the queue holds a round of the places, reading waits, to
	// read more rows at once.
	fill(1, concurrency)
	require.False(t, sub.readDue(now), "a read while the queue holds a round of the places")

	// Nothing in flight and nothing queued: a read for what room there is.
	fill(0, 0)
	st.window = make([]*row, concurrency+batch-1)
	require.True(t, sub.readDue(now), "an idle subscription reads what fits")

	// Not before its time.
	fill(concurrency, 2)
	sub.readAt = now.Add(time.Second)
	require.False(t, sub.readDue(now), "a read before readAt")
}
