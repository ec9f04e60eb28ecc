package runner

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/internal/pipeline"
)

const handBackConsumer = "runner.test.handback"

func newHandBack(t *testing.T) *handBack {
	t.Helper()
	store, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	return &handBack{consumer: handBackConsumer, store: store, maxBody: framework.DefaultMaxBodyBytes, logger: slog.New(slog.DiscardHandler)}
}

// redelivery returns what the delivery guard would count for the
// redelivery of msg's event, flagged by the transport: 1 once msg was
// recorded as handed back unhandled, 2 otherwise.
func (h *handBack) redelivery(t *testing.T, msg *message.Message) int {
	t.Helper()
	key, ok := keyOf(msg, h.maxBody)
	require.True(t, ok)
	n, err := h.store.Count(context.Background(), h.consumer, key, 2)
	require.NoError(t, err)
	return n
}

func flagged(msg *message.Message, redelivered string) *message.Message {
	if redelivered != "" {
		msg.Metadata.Set(pipeline.MetadataRedelivered, redelivered)
	}
	return msg
}

// TestHandBackRecordsFirstDeliveries: a first delivery handed back
// unhandled is recorded, so that its redelivery counts as the first; a
// redelivery, or a delivery the transport cannot classify, is not (it
// may follow one that killed a process); a message that does not decode
// is left alone.
func TestHandBackRecordsFirstDeliveries(t *testing.T) {
	h := newHandBack(t)
	first := flagged(event(t, "a", 1), "false")
	h.record(first)
	require.Equal(t, 1, h.redelivery(t, first), "a first delivery handed back costs nothing")

	again := flagged(event(t, "a", 2), "true")
	h.record(again)
	require.Equal(t, 2, h.redelivery(t, again), "a redelivery handed back stays a suspect")

	unknown := event(t, "a", 3)
	h.record(unknown)
	require.Equal(t, 2, h.redelivery(t, unknown), "nothing recorded where the transport cannot tell")

	read := flagged(event(t, "a", 4), "false")
	env, err := framework.Decode(read.Payload, 0)
	require.NoError(t, err)
	read.Payload = []byte("read ahead: not decoded again")
	read.SetContext(pipeline.With(read.Context(), &pipeline.Read[framework.Envelope]{Envelope: env}))
	h.record(read)
	require.Equal(t, 1, h.redelivery(t, read), "the envelope read ahead of the chain gives the key")

	h.record(flagged(message.NewMessage("raw", []byte("not a cloudevent")), "false")) // no panic, nothing to record

	var none *handBack
	none.record(first) // a nil handBack records nothing
}

// TestSequencerHandsBackAtStop: once the service begins to stop, the
// sequencer hands nothing more to the router: the events waiting for
// their subject's turn stay, the event whose predecessor returns stays,
// each event that comes waits too, and each is recorded as handed back;
// once Stop gives up waiting (closing), they are nacked, and so is each
// event that comes from then on, recorded first. The event in flight is
// not the sequencer's to record (the intake or the guard see to it).
func TestSequencerHandsBackAtStop(t *testing.T) {
	h := newHandBack(t)
	in := make(chan *message.Message)
	nacked := make(chan *message.Message, 10)
	stopping, closing := make(chan struct{}), make(chan struct{})
	seq := newSequencer(framework.DefaultMaxBodyBytes, settled{nacked: nacked})
	seq.handBack, seq.stopping, seq.closing = h, stopping, closing
	out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
	require.NoError(t, err)

	ev := func(subject string, n int64) *message.Message { return flagged(event(t, subject, n), "false") }
	a1, a2, a3, a4, b1, c1 := ev("a", 1), ev("a", 2), ev("a", 3), ev("a", 4), ev("b", 1), ev("c", 1)
	in <- a1
	require.Same(t, a1, receive(t, out))
	in <- a2
	in <- a3
	require.Eventually(t, func() bool { return seq.waitingEvents() == 2 }, 5*time.Second, time.Millisecond)
	close(stopping)
	in <- a4
	in <- b1 // a subject of its own: waits all the same
	raw := flagged(message.NewMessage("raw", []byte("not a cloudevent")), "false")
	in <- raw
	require.Eventually(t, func() bool { return seq.waitingEvents() == 5 }, 5*time.Second, time.Millisecond)
	seq.done(a1) // returns at once: a2 stays
	none(t, out)
	require.Equal(t, 5, seq.waitingEvents())

	close(closing)
	got := map[*message.Message]bool{}
	for range 5 {
		got[<-nacked] = true
	}
	require.Equal(t, map[*message.Message]bool{a2: true, a3: true, a4: true, b1: true, raw: true}, got)
	in <- c1 // after closing: nacked at once
	require.Same(t, c1, <-nacked)
	none(t, out)
	close(in)
	_, open := <-out
	require.False(t, open)
	for _, msg := range []*message.Message{a2, a3, a4, b1, c1} {
		require.Equal(t, 1, h.redelivery(t, msg), "%s was handed back unhandled", msg.UUID)
	}
	require.Equal(t, 2, h.redelivery(t, a1), "the event in flight is not the sequencer's to record")
	require.Zero(t, seq.waitingEvents())
}
