package runner

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// chanSubscriber hands out what the test sends on ch.
type chanSubscriber struct{ ch chan *message.Message }

func (s chanSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return s.ch, nil
}

func (s chanSubscriber) Close() error { return nil }

// settled records the outcomes a sequencer reports.
type settled struct{ nacked chan *message.Message }

func (s settled) Settle(msg *message.Message, acked bool) {
	if !acked {
		s.nacked <- msg
	}
}

func event(t *testing.T, subject string, seq int64) *message.Message {
	t.Helper()
	env, err := framework.Define[struct{}]("runner.test.stepped", 1).Envelope(struct{}{}, framework.Attributes{
		ID: fmt.Sprintf("%s-%d", subject, seq), Source: "test", Subject: subject, SubjectSeq: seq,
	})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	return msg
}

func receive(t *testing.T, out <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-out:
		return msg
	case <-time.After(5 * time.Second):
		t.Fatal("no message came out")
		return nil
	}
}

func none(t *testing.T, out <-chan *message.Message) {
	t.Helper()
	select {
	case msg := <-out:
		t.Fatalf("message %s came out before its turn", msg.UUID)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestSequencer: an event waits for the one of its subject in flight, in
// arrival order; other subjects and events without a subject pass at
// once; when the subscription ends, the waiting events are nacked and
// told to the settler.
func TestSequencer(t *testing.T) {
	in := make(chan *message.Message)
	nacked := make(chan *message.Message, 10)
	seq := newSequencer(framework.DefaultMaxBodyBytes, settled{nacked: nacked})
	out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
	require.NoError(t, err)

	a1, a2, a3, b1 := event(t, "a", 1), event(t, "a", 2), event(t, "a", 3), event(t, "b", 1)
	in <- a1
	require.Same(t, a1, receive(t, out))
	read, ok := pipeline.From[*pipeline.Read[framework.Envelope]](a1.Context())
	require.True(t, ok, "the envelope read for its subject goes on to the chain")
	require.Equal(t, "a-1", read.Envelope.ID)
	in <- a2
	in <- a3
	in <- b1
	require.Same(t, b1, receive(t, out), "another subject passes")
	raw := message.NewMessage("raw", []byte("not a cloudevent"))
	in <- raw
	require.Same(t, raw, receive(t, out), "no subject: passes")
	_, ok = pipeline.From[*pipeline.Read[framework.Envelope]](raw.Context())
	require.False(t, ok, "a body that does not decode is left to the chain")
	none(t, out)
	require.Equal(t, 2, seq.waitingEvents())

	go seq.done(a1)
	require.Same(t, a2, receive(t, out), "a2 after a1")
	none(t, out)
	go seq.done(b1)
	none(t, out)
	go seq.done(a2)
	require.Same(t, a3, receive(t, out), "a3 after a2")
	require.Zero(t, seq.waitingEvents())

	a4, a5 := event(t, "a", 4), event(t, "a", 5)
	in <- a4
	in <- a5
	close(in)
	require.Same(t, a4, <-nacked, "waiting when the subscription ended")
	require.Same(t, a5, <-nacked)
	_, open := <-out
	require.False(t, open, "the channel closes once the subscription's did")
	seq.done(a3) // nothing waits any more
	require.Zero(t, seq.waitingEvents())
	require.Empty(t, seq.inFlight)
}

// holding records the events a sequencer holds out of the window, up to
// room of them.
type holding struct {
	mu   sync.Mutex
	room int
	held []string
}

func (h *holding) Hold(msg *message.Message) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.held) == h.room {
		return false
	}
	h.held = append(h.held, msg.UUID)
	return true
}

func (h *holding) events() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.held...)
}

// TestSequencerHoldsBeyondShare: of a subject's events in the consumer,
// waiting or on their way, a quarter of the window's places (here one of
// four) hold places of it; those behind are held out of it while the
// subscriber takes them, and hold places once it no longer does; each
// event's end frees its place.
func TestSequencerHoldsBeyondShare(t *testing.T) {
	in := make(chan *message.Message)
	seq := newSequencer(framework.DefaultMaxBodyBytes, nil)
	h := &holding{room: 2}
	seq.holdBeyond(4, h)
	out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
	require.NoError(t, err)

	a := make([]*message.Message, 7)
	for i := 1; i < len(a); i++ {
		a[i] = event(t, "a", int64(i))
	}
	in <- a[1]
	require.Same(t, a[1], receive(t, out))
	for _, msg := range a[2:] {
		in <- msg
	}
	b1 := event(t, "b", 1)
	in <- b1
	require.Same(t, b1, receive(t, out))
	b2 := event(t, "b", 2)
	in <- b2
	none(t, out)
	require.Equal(t, []string{a[2].UUID, a[3].UUID}, h.events(), "a1 holds a's place, a2 and a3 wait out of the window; a4 to a6, and b2, in it: no more room")
	seq.mu.Lock()
	require.Equal(t, map[string]int{"a": 4, "b": 2}, seq.placed)
	seq.mu.Unlock()

	for i := 1; i < 6; i++ {
		go seq.done(a[i])
		require.Same(t, a[i+1], receive(t, out), "in order")
	}
	go seq.done(b1)
	require.Same(t, b2, receive(t, out))
	require.Zero(t, seq.waitingEvents())
	seq.done(a[6])
	seq.done(b2)
	seq.mu.Lock()
	require.Empty(t, seq.placed, "each event's end frees its place")
	seq.mu.Unlock()
	close(in)
	_, open := <-out
	require.False(t, open)
}

// TestShare: the partitions fall to the sorted members in turn, so that
// each holds as many as any other, give or take one; a member not in the
// list has none.
func TestShare(t *testing.T) {
	members := []string{"a", "b", "c"}
	got := map[string][]int{}
	for _, m := range members {
		for p := range 8 {
			if share(members, m, 8)[p] {
				got[m] = append(got[m], p)
			}
		}
	}
	require.Equal(t, map[string][]int{"a": {0, 3, 6}, "b": {1, 4, 7}, "c": {2, 5}}, got)
	require.Empty(t, share(members, "d", 8))
}

// closingSubscriber hands out what the test sends on ch, and closes ch
// on Close once allow is closed: a subscription whose channel ends a
// while after the router began to close.
type closingSubscriber struct {
	ch    chan *message.Message
	allow chan struct{}
	once  *sync.Once
}

func (s closingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return s.ch, nil
}

func (s closingSubscriber) Close() error {
	<-s.allow
	s.once.Do(func() { close(s.ch) })
	return nil
}

// TestSequencerRouterClose: handlers that return while the router closes
// hand the next events of their subjects on without waiting for the
// router to take them. Watermill's Router.Close holds, until every
// running handler returned, the lock its loop takes to start a handler;
// a handler that waited for the loop to take the next event of its
// subject (the loop blocked on that lock with another event, the
// sequencer's own goroutine blocked behind it) held the close until its
// timeout: a stopping process of a strict_order consumer waited its 30 s
// and failed its stop.
func TestSequencerRouterClose(t *testing.T) {
	in := make(chan *message.Message, 16)
	allow := make(chan struct{})
	sub := closingSubscriber{ch: in, allow: allow, once: &sync.Once{}}
	seq := newSequencer(framework.DefaultMaxBodyBytes, nil)
	const closeTimeout = 10 * time.Second
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: closeTimeout}, nil)
	require.NoError(t, err)
	running := make(chan string, 16)
	release := make(chan struct{})
	router.AddConsumerHandler("h", "t", seq.subscriber(sub), func(msg *message.Message) error {
		defer seq.done(msg) // as the runner's intake does
		running <- msg.UUID
		<-release
		return nil
	})
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(context.Background()) }()
	<-router.Running()

	// Three subjects in flight, each with an event waiting in its line.
	for _, s := range []string{"a", "b", "c"} {
		in <- event(t, s, 1)
	}
	for range 3 {
		select {
		case <-running:
		case <-time.After(5 * time.Second):
			t.Fatal("the first events did not reach their handlers")
		}
	}
	for _, s := range []string{"a", "b", "c"} {
		in <- event(t, s, 2)
	}
	require.Eventually(t, func() bool { return seq.waitingEvents() == 3 }, 5*time.Second, 10*time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- router.Close() }()
	time.Sleep(300 * time.Millisecond) // Close waits for the running handlers, holding the loop's lock
	close(release)                     // the handlers return, their next events' turns come
	time.Sleep(300 * time.Millisecond)
	in <- event(t, "d", 1) // the sequencer's goroutine takes it, then waits for the router
	time.Sleep(300 * time.Millisecond)
	close(allow) // the subscription's channel ends

	select {
	case err := <-closed:
		require.NoError(t, err, "the router closed in time")
	case <-time.After(closeTimeout + 5*time.Second):
		t.Fatal("the router did not close")
	}
	select {
	case err := <-runDone:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the router did not stop running")
	}
}
