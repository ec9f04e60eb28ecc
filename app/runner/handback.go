package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// handBackTimeout bounds the store's write that records a message handed
// back unhandled: past it the message goes back unrecorded.
const handBackTimeout = 5 * time.Second

// handBack records, before the runner nacks a message of one consumer
// that it hands back unhandled (the intake closed by Stop, an event
// waiting for its subject's turn when the service stops), that the
// delivery cost nothing: a rebalance or a stop never counts towards
// max_deliveries.
//
// Only a first delivery, as the transport vouched
// (pipeline.Redelivered), needs it: the delivery guard charged nothing
// for it, but its redelivery comes flagged, and a redelivery without a
// count counts as the second delivery (its first may be the one that
// killed a process). So its key gets a count at zero
// (driver.Store.Count with first 0), and the redelivery counts as the
// first. A redelivery handed back keeps what it has: a count, which
// stays, or none, and then it may still be the message that killed a
// process, and its next delivery counts as the second, as before.
type handBack struct {
	consumer string
	store    driver.Store
	maxBody  int
	logger   *slog.Logger
}

// record records msg, which the runner nacks next without handling it
// (see handBack). It logs a failure: the message then goes back
// unrecorded, and its redelivery counts as the second delivery.
func (h *handBack) record(msg *message.Message) {
	if h == nil {
		return
	}
	if redelivered, known := pipeline.Redelivered(msg); !known || redelivered {
		return
	}
	key, ok := keyOf(msg, h.maxBody)
	if !ok {
		return // the chain would dead-letter it: nothing to count
	}
	// The message's context may have ended (the subscription's did).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), handBackTimeout)
	defer cancel()
	if _, err := h.store.Count(ctx, h.consumer, key, 0); err != nil {
		h.logger.WarnContext(ctx, "runner: a first delivery handed back unhandled was not recorded; its redelivery counts as the second",
			"consumer", h.consumer, "source", key.Source, "event_id", key.ID, "error", err)
	}
}

// records records each of msgs (see record), concurrently: a stop hands
// back up to a window of them, each a statement of its own, and waits
// about one round trip's time instead of one per message.
func (h *handBack) records(msgs []*message.Message) {
	if h == nil {
		return
	}
	var wg sync.WaitGroup
	for _, msg := range msgs {
		wg.Go(func() { h.record(msg) })
	}
	wg.Wait()
}

// keyOf returns the key of msg's event, as the delivery guard keys its
// count: from the envelope read ahead of the chain (pipeline.Read) or
// decoded here; false when it does not decode or its key is not one a
// store can hold.
func keyOf(msg *message.Message, maxBody int) (framework.Key, bool) {
	var env framework.Envelope
	if r, ok := pipeline.From[*pipeline.Read[framework.Envelope]](msg.Context()); ok {
		env = r.Envelope
	} else {
		var err error
		if env, err = driver.DecodeMessage(msg, maxBody); err != nil {
			return framework.Key{}, false
		}
	}
	key := env.Key()
	if key.Validate() != nil {
		return framework.Key{}, false
	}
	return key, true
}
