package runner

import (
	"context"
	"fmt"
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
