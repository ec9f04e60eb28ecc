package driver

import (
	"context"
	"sync"
)

// batchContext returns the context of a batch's transaction: the values
// of the first attempt's context, not its end, so that no attempt's
// cancellation interrupts the others' statements; it ends when every
// attempt's context has ended, since no one waits for the batch then.
// It watches one attempt's context at a time (see batchWatch), not each
// of them: a watch costs a registration with the context's parent, and
// the attempts of a batch rarely end before it does.
func batchContext(batch []*attemptRun) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	w := &batchWatch{batch: batch, cancel: cancel}
	w.mu.Lock()
	w.watchFrom(0)
	w.mu.Unlock()
	return ctx, w.stop
}

// batchWatch ends a batch's context once every attempt's context has
// ended: it watches the first attempt whose context is alive, and when
// that one ends, the next one alive after it; the contexts before the
// watched one have ended, and an ended context never comes back to life.
type batchWatch struct {
	batch  []*attemptRun
	cancel context.CancelFunc

	mu      sync.Mutex
	watched int         // the attempt watched
	unwatch func() bool // stops the watch of batch[watched]
	stopped bool
}

// watchFrom watches the first attempt from i on whose context is alive,
// or ends the batch's context when none is. Call it with w.mu held.
func (w *batchWatch) watchFrom(i int) {
	for ; i < len(w.batch); i++ {
		if w.batch[i].ctx.Err() == nil {
			w.watched = i
			// Should the context end meanwhile, ended runs at once (on
			// a goroutine of its own): it waits for w.mu.
			w.unwatch = context.AfterFunc(w.batch[i].ctx, w.ended)
			return
		}
	}
	w.unwatch = nil
	w.cancel()
}

// ended moves the watch past the attempt whose context ended.
func (w *batchWatch) ended() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.watchFrom(w.watched + 1)
	}
}

// stop ends the watch and the batch's context.
func (w *batchWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.unwatch != nil {
		w.unwatch()
	}
	w.mu.Unlock()
	w.cancel()
}
