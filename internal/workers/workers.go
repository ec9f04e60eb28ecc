// Package workers runs message handlers on goroutines that outlive one
// message.
//
// Watermill's router starts a goroutine for every message it delivers. A
// goroutine's stack starts small (2 to 8 KiB) and is copied to one twice
// its size each time a call needs more: on the way down the consumer
// chain (decoding, the handler, the database driver) a message's
// goroutine doubles its stack several times, and each copy walks every
// frame on it. A Pool's worker keeps its grown stack from one message to
// the next, and the router's goroutine only waits for it.
package workers

import (
	"runtime"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Pool is a set of worker goroutines, started as they are needed: a
// handler that finds no worker idle starts one, so that a Pool never
// makes a message wait for another. Workers stay, idle, until Close. The
// zero value is ready to use; a Pool must not be copied after first use.
type Pool struct {
	mu     sync.Mutex
	idle   []*worker // the most recently used last
	closed bool
}

// worker is a goroutine that handles one message at a time: its caller
// sends the job and waits on done, then reads the result.
type worker struct {
	jobs chan job
	done chan struct{}

	// The result of the last job, written before done is signalled.
	out      []*message.Message
	err      error
	panicked any
	exited   bool // the job called runtime.Goexit
}

// job is a handler and the message it handles.
type job struct {
	h   message.HandlerFunc
	msg *message.Message
}

// Handle runs h(msg) on a worker and returns its result. A panic of h is
// raised again, with its value, on the caller's goroutine, and a
// runtime.Goexit of h ends the caller's goroutine too: to the caller,
// Handle is h. After Close, h runs on a worker started for it alone.
func (p *Pool) Handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	w := p.get()
	w.jobs <- job{h: h, msg: msg}
	<-w.done
	if w.exited {
		runtime.Goexit() // the worker has ended with its job
	}
	out, err, panicked := w.out, w.err, w.panicked
	w.out, w.err, w.panicked = nil, nil, nil // an idle worker holds no message
	p.put(w)
	if panicked != nil {
		panic(panicked)
	}
	return out, err
}

// Close ends the idle workers, and each busy one once its message is
// handled. It does not wait for them.
func (p *Pool) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, w := range idle {
		close(w.jobs)
	}
}

// get returns the most recently used idle worker, whose stack is the
// likeliest to be grown still (a garbage collection halves the stack of
// a goroutine that uses little of it), or a new one.
func (p *Pool) get() *worker {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return w
	}
	p.mu.Unlock()
	w := &worker{jobs: make(chan job), done: make(chan struct{})}
	go w.loop()
	return w
}

// put makes w idle again, or ends it once the pool is closed.
func (p *Pool) put(w *worker) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		close(w.jobs)
		return
	}
	p.idle = append(p.idle, w)
	p.mu.Unlock()
}

// loop handles the jobs sent to w until its jobs channel closes, or a
// job calls runtime.Goexit.
func (w *worker) loop() {
	for j := range w.jobs {
		w.handle(j)
	}
}

// handle runs j and records its result, its panic or its Goexit, then
// signals done.
func (w *worker) handle(j job) {
	returned := false
	defer func() {
		if !returned {
			// A panic is recovered here; a Goexit cannot be, and
			// continues once this function returns, ending the worker.
			if w.panicked = recover(); w.panicked == nil {
				w.exited = true
			}
		}
		w.done <- struct{}{}
	}()
	w.out, w.err = j.h(j.msg)
	returned = true
}
