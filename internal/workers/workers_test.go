package workers

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/internal/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// handleHeld handles a message on p, on a goroutine of done, whose
// handler calls started, then returns once release closes.
func handleHeld(p *Pool, done *sync.WaitGroup, started func(), release <-chan struct{}) {
	done.Go(func() {
		_, _ = p.Handle(func(*message.Message) ([]*message.Message, error) {
			started()
			<-release
			return nil, nil
		}, message.NewMessage("held", nil))
	})
}

func idle(p *Pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func TestHandle(t *testing.T) {
	var p Pool
	defer p.Close()
	msg := message.NewMessage("1", nil)
	want := errors.New("failed")
	out, err := p.Handle(func(got *message.Message) ([]*message.Message, error) {
		if got != msg {
			t.Errorf("handler got %v, want the message handled", got)
		}
		return []*message.Message{got}, want
	}, msg)
	if len(out) != 1 || out[0] != msg || !errors.Is(err, want) {
		t.Fatalf("Handle = %v, %v; want the handler's [msg], %v", out, err, want)
	}
	// A second message, once the first is done, goes to the same worker.
	if _, err := p.Handle(func(*message.Message) ([]*message.Message, error) { return nil, nil }, msg); err != nil {
		t.Fatal(err)
	}
	if n := idle(&p); n != 1 {
		t.Fatalf("%d idle workers after two messages one after the other, want 1", n)
	}
}

// TestHandleConcurrent: a message that finds every worker busy gets a
// worker of its own; it never waits for another message.
func TestHandleConcurrent(t *testing.T) {
	var p Pool
	defer p.Close()
	const n = 8
	var started sync.WaitGroup
	started.Add(n)
	release := make(chan struct{})
	var done sync.WaitGroup
	for range n {
		handleHeld(&p, &done, started.Done, release) // held until all n run at once
	}
	started.Wait()
	close(release)
	done.Wait()
	if got := idle(&p); got != n {
		t.Fatalf("%d idle workers after %d messages at once, want %d", got, n, n)
	}
}

func TestHandlePanic(t *testing.T) {
	var p Pool
	defer p.Close()
	value := &struct{ bug string }{"handler bug"} // compared by identity
	func() {
		defer func() {
			if got, ok := recover().(*struct{ bug string }); !ok || got != value {
				t.Errorf("recovered %v, want the handler's panic %v", got, value)
			}
		}()
		_, _ = p.Handle(func(*message.Message) ([]*message.Message, error) { panic(value) }, message.NewMessage("1", nil))
		t.Error("Handle returned after the handler panicked")
	}()
	// The worker recovered and handles the next message.
	out, err := p.Handle(func(m *message.Message) ([]*message.Message, error) { return []*message.Message{m}, nil }, message.NewMessage("2", nil))
	if len(out) != 1 || err != nil {
		t.Fatalf("after a panic: Handle = %v, %v", out, err)
	}
	if n := idle(&p); n != 1 {
		t.Fatalf("%d idle workers, want the one that recovered", n)
	}
}

// TestHandleGoexit: a handler that calls runtime.Goexit (t.FailNow in a
// test's handler) ends its worker and the caller's goroutine, as it
// would end the router's goroutine without a pool; nothing hangs.
func TestHandleGoexit(t *testing.T) {
	var p Pool
	defer p.Close()
	returned := make(chan bool, 1)
	go func() {
		ended := true
		defer func() { returned <- ended }()
		_, _ = p.Handle(func(*message.Message) ([]*message.Message, error) {
			runtime.Goexit()
			return nil, nil
		}, message.NewMessage("1", nil))
		ended = false // not reached
	}()
	if !<-returned {
		t.Fatal("Handle returned after the handler's Goexit")
	}
	if n := idle(&p); n != 0 {
		t.Fatalf("%d idle workers, want none: the one whose job exited has ended", n)
	}
}

// TestClose: Close ends the idle workers and, once done, the busy ones
// (TestMain checks that none is left); a message handled after Close
// still is.
func TestClose(t *testing.T) {
	var p Pool
	release := make(chan struct{})
	busy := make(chan struct{})
	var done sync.WaitGroup
	handleHeld(&p, &done, func() { close(busy) }, release)
	<-busy
	if _, err := p.Handle(func(*message.Message) ([]*message.Message, error) { return nil, nil }, message.NewMessage("2", nil)); err != nil {
		t.Fatal(err)
	}
	p.Close()
	close(release)
	done.Wait()
	handled := false
	if _, err := p.Handle(func(*message.Message) ([]*message.Message, error) { handled = true; return nil, nil }, message.NewMessage("3", nil)); err != nil || !handled {
		t.Fatalf("after Close: handled %v, err %v", handled, err)
	}
	if n := idle(&p); n != 0 {
		t.Fatalf("%d idle workers after Close", n)
	}
}

// BenchmarkHandle is the hand-off's own cost: a message that returns at
// once, handled on a worker instead of the caller's goroutine.
func BenchmarkHandle(b *testing.B) {
	var p Pool
	defer p.Close()
	msg := message.NewMessage("1", nil)
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	b.ReportAllocs()
	for b.Loop() {
		_, _ = p.Handle(h, msg)
	}
}
