package runner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// TestWaitingGauge: effectively_consumer_waiting_messages says, by
// consumer, how many events wait in its sequencer for an earlier one of
// their subject; the events let go are not counted.
func TestWaitingGauge(t *testing.T) {
	in := make(chan *message.Message)
	seq := newSequencer(framework.DefaultMaxBodyBytes, nil)
	out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
	require.NoError(t, err)
	idle := newSequencer(framework.DefaultMaxBodyBytes, nil)
	c := newWaitingCollector(map[string]*sequencer{"projection": seq, "audit": idle})

	want := func(projection int) string {
		return `# HELP effectively_consumer_waiting_messages Events of an ordered consumer (strict_order, skip_stale) waiting in this process for an earlier event of their subject, unacknowledged; this process's own figure.
# TYPE effectively_consumer_waiting_messages gauge
effectively_consumer_waiting_messages{consumer="audit"} 0
effectively_consumer_waiting_messages{consumer="projection"} ` + string(rune('0'+projection)) + "\n"
	}
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(0))))

	a1, a2, a3 := event(t, "a", 1), event(t, "a", 2), event(t, "a", 3)
	in <- a1
	require.Same(t, a1, receive(t, out))
	in <- a2
	in <- a3
	require.Eventually(t, func() bool { return seq.waitingEvents() == 2 }, 5*time.Second, time.Millisecond)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(2))), "a2 and a3 wait for a1")

	go seq.done(a1)
	require.Same(t, a2, receive(t, out))
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(1))), "a3 waits for a2")
	close(in)
}
