package nackdelay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/internal/nackdelay"
)

// TestNackStreak: the pause after a nack is the first pause plus the time
// since the first nack after the last ack, up to the longest.
func TestNackStreak(t *testing.T) {
	t.Parallel()
	const first, most = 100 * time.Millisecond, 400 * time.Millisecond
	b := nackdelay.Backoff{First: first, Max: most}
	t0 := time.Unix(1000, 0)
	var n nackdelay.Streak

	// A message nacked on every delivery, alone: the pauses double.
	at := t0
	for _, want := range []time.Duration{100, 200, 400, 400} {
		pause := n.Nacked(at, b)
		require.Equal(t, want*time.Millisecond, pause, "nack at %s", at.Sub(t0))
		at = at.Add(pause)
	}

	// An ack ends the streak; messages nacked together then each wait the
	// first pause, however many they are.
	n.Acked()
	for i := range 64 {
		require.Equal(t, first, n.Nacked(at, b), "nack %d of a burst", i+1)
	}
	// Nothing acked since: the next round waits longer.
	require.Equal(t, first+first, n.Nacked(at.Add(first), b))
}
