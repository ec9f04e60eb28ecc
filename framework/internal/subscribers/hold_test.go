package subscribers

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHolds: up to the limit of places are held, each once; a settled
// place is held no more; settling a held place frees a hold for another
// (and says so), settling one in the window does not; each hold signals
// Wake once pending.
func TestHolds(t *testing.T) {
	h := NewHolds(2)
	var a, b, c, d Place
	require.True(t, h.Hold(&a))
	require.False(t, h.Hold(&a), "held already")
	require.True(t, h.Hold(&b))
	require.False(t, h.Hold(&c), "two at most")
	require.Equal(t, 2, h.Held())
	select {
	case <-h.Wake():
	default:
		t.Fatal("no wake after a hold")
	}
	require.False(t, h.Settle(&c), "c had its place in the window")
	require.False(t, h.Hold(&c), "settled: never held")
	require.True(t, h.Settle(&a))
	require.Equal(t, 1, h.Held())
	require.True(t, h.Hold(&d), "a's hold is free again")
	require.True(t, h.Settle(&b))
	require.True(t, h.Settle(&d))
	require.Zero(t, h.Held())

	var none *Holds
	require.False(t, none.Hold(&Place{}), "a nil Holds holds nothing")
	require.False(t, none.Settle(&Place{}))
	require.Zero(t, none.Held())
	require.Nil(t, none.Wake())
}
