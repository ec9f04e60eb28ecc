package subscribers

import "sync/atomic"

// Holds counts the messages of a subscription that its reader holds out
// of the window (driver.Holder), up to a limit, for the transports'
// Hold: a held message's settling frees no place of the window. Its
// methods are safe for concurrent use. A nil *Holds holds nothing.
type Holds struct {
	limit int
	n     atomic.Int32
	wake  chan struct{}
}

// Place is where a message handed out stands: in the window, held out of
// it, or settled. The zero Place is in the window.
type Place struct{ state atomic.Int32 }

// The states of a Place.
const (
	inWindow int32 = iota
	held
	gone
)

// NewHolds returns the holds of a subscription whose reader may hold up
// to limit messages at once.
func NewHolds(limit int) *Holds {
	return &Holds{limit: limit, wake: make(chan struct{}, 1)}
}

// Hold moves p, the place of a message in the window, out of it, unless
// limit messages are held already or p is held or settled; it reports
// whether it did, and then signals Wake.
func (h *Holds) Hold(p *Place) bool {
	if h == nil {
		return false
	}
	if int(h.n.Add(1)) > h.limit || !p.state.CompareAndSwap(inWindow, held) {
		h.n.Add(-1)
		return false
	}
	select {
	case h.wake <- struct{}{}:
	default: // a signal is pending already
	}
	return true
}

// Settle marks p settled, once its message is (call it once), and
// reports whether it was held: false means its message still had its
// place in the window, for the caller to free.
func (h *Holds) Settle(p *Place) (wasHeld bool) {
	if h == nil || p.state.Swap(gone) != held {
		return false
	}
	h.n.Add(-1)
	return true
}

// Held is how many messages are held.
func (h *Holds) Held() int {
	if h == nil {
		return 0
	}
	return int(h.n.Load())
}

// Wake receives a signal after a Hold (one pending at most), for a loop
// that hands out messages while fewer than its window are not held.
func (h *Holds) Wake() <-chan struct{} {
	if h == nil {
		return nil // never
	}
	return h.wake
}
