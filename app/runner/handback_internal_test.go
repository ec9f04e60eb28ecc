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

// TestSequencerRecordsWaitingAtStop: once the service begins to stop,
// the events waiting for their subject's turn are recorded as handed
// back, and so is each event put in a line from then on; the event in
// flight is not (the intake or the guard see to it).
func TestSequencerRecordsWaitingAtStop(t *testing.T) {
	h := newHandBack(t)
	in := make(chan *message.Message)
	nacked := make(chan *message.Message, 10)
	stopping := make(chan struct{})
	seq := newSequencer(framework.DefaultMaxBodyBytes, settled{nacked: nacked})
	seq.handBack, seq.stopping = h, stopping
	out, err := seq.subscriber(chanSubscriber{ch: in}).Subscribe(context.Background(), "t")
	require.NoError(t, err)

	a1, a2, a3, a4 := flagged(event(t, "a", 1), "false"), flagged(event(t, "a", 2), "false"), flagged(event(t, "a", 3), "false"), flagged(event(t, "a", 4), "false")
	in <- a1
	require.Same(t, a1, receive(t, out))
	in <- a2
	in <- a3
	require.Eventually(t, func() bool { return seq.waitingEvents() == 2 }, 5*time.Second, time.Millisecond)
	close(stopping)
	in <- a4 // after the waiting ones were recorded: forward took it
	require.Eventually(t, func() bool { return seq.waitingEvents() == 3 }, 5*time.Second, time.Millisecond)
	close(in)
	for range 3 {
		<-nacked
	}
	for _, msg := range []*message.Message{a2, a3, a4} {
		require.Equal(t, 1, h.redelivery(t, msg), "%s waited when the service stopped", msg.UUID)
	}
	require.Equal(t, 2, h.redelivery(t, a1), "the event in flight is not the sequencer's to record")
}
