package runner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// modelRouter plays the router and the unit of work behind a sequencer:
// each event it takes joins the queue (pipeline.Turn.Joined) or not, and
// returns (done) after a random while. It checks that an event of a
// subject comes only once the one before it, taken earlier, joined or
// returned, and records what it took.
type modelRouter struct {
	t   *testing.T
	seq *sequencer

	mu       sync.Mutex
	rng      *rand.Rand
	taken    map[*message.Message]bool
	lastOf   map[string]*message.Message // the subject's event taken last
	released map[*message.Message]bool   // joined or returned: the next may go
	wg       sync.WaitGroup
}

func (r *modelRouter) take(msg *message.Message) {
	subject := msg.Metadata.Get("subject")
	r.mu.Lock()
	if r.taken[msg] {
		r.t.Errorf("%s taken twice", msg.UUID) // not require: take runs on the readers' goroutines
	}
	r.taken[msg] = true
	if prev := r.lastOf[subject]; prev != nil && !r.released[prev] {
		r.t.Errorf("%s came before %s joined or returned", msg.UUID, prev.UUID)
	}
	r.lastOf[subject] = msg
	join, pause := r.rng.IntN(2) == 0, time.Duration(r.rng.IntN(300))*time.Microsecond
	r.mu.Unlock()
	turn, _ := pipeline.From[*pipeline.Turn](msg.Context())
	r.wg.Go(func() {
		time.Sleep(pause)
		if join && turn != nil {
			r.release(msg)
			turn.Joined()
		}
		time.Sleep(pause)
		r.release(msg)
		r.seq.done(msg)
	})
}

func (r *modelRouter) release(msg *message.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released[msg] = true
}

// TestSequencerModel runs random schedules of events of a few subjects
// through a sequencer from two subscriptions, one of which ends midway,
// with some events held out of the window: every event reaches the
// router, once, a subject's in order, or is nacked once its subscription
// ended, and nothing is left waiting or in flight.
func TestSequencerModel(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runSequencerModel(t, seed) })
	}
}

func runSequencerModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	nacked := make(chan *message.Message, 1000)
	seq := newSequencer(framework.DefaultMaxBodyBytes, settled{nacked: nacked})
	seq.holdBeyond(8, &holding{room: rng.IntN(6)})
	r := &modelRouter{
		t: t, seq: seq, rng: rand.New(rand.NewPCG(seed, 9)),
		taken: map[*message.Message]bool{}, lastOf: map[string]*message.Message{}, released: map[*message.Message]bool{},
	}

	ins := []chan *message.Message{make(chan *message.Message), make(chan *message.Message)}
	var readers sync.WaitGroup
	for _, in := range ins {
		out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
		require.NoError(t, err)
		readers.Go(func() {
			for msg := range out {
				r.take(msg)
			}
		})
	}

	const events = 300
	var sent []*message.Message
	open := []bool{true, true}
	for i := range events {
		subject := fmt.Sprintf("s%d", rng.IntN(4))
		msg := event(t, subject, int64(i+1))
		msg.Metadata.Set("subject", subject)
		sub := rng.IntN(2)
		if !open[sub] {
			sub = 1 - sub
		}
		ins[sub] <- msg
		sent = append(sent, msg)
		if i == events/2 {
			close(ins[0]) // the first subscription ends midway
			open[0] = false
		}
		if rng.IntN(10) == 0 {
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		}
	}
	// Every event of the open subscription reaches the router: none
	// waits for good.
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.taken)+len(nacked) == events
	}, 10*time.Second, time.Millisecond, "events left waiting")
	close(ins[1])
	readers.Wait()
	r.wg.Wait()

	got := map[*message.Message]int{}
	for msg := range r.taken {
		got[msg]++
	}
	close(nacked)
	for msg := range nacked {
		got[msg]++
	}
	for _, msg := range sent {
		require.Equal(t, 1, got[msg], "%s: taken by the router or nacked, once", msg.UUID)
	}
	require.Zero(t, seq.waitingEvents(), "nothing waits")
	require.Empty(t, seq.inFlight, "nothing in flight")
	require.Empty(t, seq.lines, "no line left")
	require.Empty(t, seq.placed, "no place held")
}
