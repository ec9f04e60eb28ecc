package transporttest

import (
	"bufio"
	"bytes"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// caseReported: a reader that acks or nacks each message itself and
// reports which to the transport, as the runner does (subscribed with
// driver.SubscribeConfig.Settles, a middleware telling each outcome to
// the driver.Settler subscriber), gets every message, a nacked one
// again, and an acked one never again. With
// Env.SettleReported: closed while its reader holds messages, the
// subscriber returns at once and they come again; and the messages held
// in flight (up to the consumer's concurrency at once) cost the
// transport no goroutine each: the goroutines of the case's router and
// subscription (counted by a profiler label they inherit) grow by about
// one a message held, the router's, not two.
func caseReported(t *testing.T, s *suite) {
	const held = 40
	var (
		hold, holdAtClose = make(chan struct{}), make(chan struct{})
		holding, atClose  atomic.Int32
	)
	s.setBehave(func(d delivery) error {
		switch {
		case strings.Contains(d.payload, `"reported-nack-`) && d.call == 1:
			return errNack
		case strings.Contains(d.payload, `"reported-held-`):
			holding.Add(1)
			<-hold
		case strings.Contains(d.payload, `"reported-close-`) && d.call == 1:
			atClose.Add(1)
			<-holdAtClose
		}
		return nil
	})
	name := s.consumer("reported")
	first := s.launch(t, name, held, nil, true, s.topic("a"))

	want := s.publishN(t, s.topic("a"), "reported-nack", 10)
	s.waitAcked(t, name, want)
	settle()
	s.requireIntact(t, name, want)
	for _, m := range want {
		require.Lenf(t, s.deliveriesOf(name, m.payload), 2, "deliveries of %s: nacked once, then acked", m.payload)
	}
	if !s.env.SettleReported {
		return // a transport may hand out one message at a time
	}

	// Closed while its reader holds messages, a subscriber returns without
	// waiting for their reports, and the messages come again.
	closing := s.publishN(t, s.topic("a"), "reported-close", 5)
	s.waitFor(t, "5 messages held at close", func() bool { return atClose.Load() == 5 })
	closed := make(chan error, 1)
	go func() { closed <- first.sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(s.env.Timeout):
		t.Fatal("Close waited for the reports of the messages held")
	}
	close(holdAtClose) // their reports come after the close: dropped
	first.stop()
	s.mu.Lock()
	delete(s.acked, name) // the late acks of the closed reader counted nothing
	s.mu.Unlock()
	second := s.launch(t, name, held, nil, true, s.topic("a"))
	s.waitAcked(t, name, closing)
	for _, m := range closing {
		require.GreaterOrEqualf(t, len(s.deliveriesOf(name, m.payload)), 2, "deliveries of %s: held at close, then again", m.payload)
	}

	idle := labelled(t, second.label)
	heldMsgs := s.publishN(t, s.topic("a"), "reported-held", held)
	s.waitFor(t, fmt.Sprintf("%d messages held in flight", held), func() bool { return holding.Load() == held })
	grown := labelled(t, second.label) - idle
	close(hold)
	s.waitAcked(t, name, heldMsgs)
	settle()
	s.requireIntact(t, name, append(append(want, closing...), heldMsgs...))
	// The subscription's own goroutines come and go (a wait for a
	// notification), a few either way.
	require.GreaterOrEqual(t, grown, held*3/4, "the label counts the router's goroutine of each message held")
	require.Lessf(t, grown, held+held/4, "goroutines with %d messages held in flight: one each is the router's; the transport should add none", held)
}

// labelled returns how many goroutines carry the profiler label
// "transporttest" with value label.
func labelled(t *testing.T, label string) int {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 1))
	want := fmt.Sprintf(`"transporttest":%q`, label)
	n, count := 0, 0
	sc := bufio.NewScanner(&b)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if c, _, ok := strings.Cut(line, " @ "); ok {
			count, _ = strconv.Atoi(c)
			continue
		}
		if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, want) {
			n += count
		}
	}
	require.NoError(t, sc.Err())
	return n
}
