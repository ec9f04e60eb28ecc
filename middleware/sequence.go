package middleware

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// sequenceGuard skips stale events: inside the attempt's transaction it
// moves the checkpoint of the event's subject (CloudEvents subject and
// subjectseq) to the event's sequence, and when the checkpoint is already
// there or past it, the handler does not run: a newer event of the same
// subject took effect first. The event is marked processed and
// acknowledged all the same. Events without subject or subjectseq pass
// through.
//
// It gives a projection the latest state per subject whatever the order of
// delivery, the "apply only if newer" rule; it does not wait for a missing
// earlier event. It sits inside unitOfWork.
func sequenceGuard(consumer string, store driver.Store) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, err := eventOf(msg.Context())
			if err != nil {
				return nil, err
			}
			if d.Subject == "" || d.SubjectSeq == 0 {
				return next(msg)
			}
			tx, ok := pipeline.From[*driver.Tx](msg.Context())
			if !ok {
				return nil, errors.New("sequence guard: no attempt transaction: place it inside unitOfWork")
			}
			advanced, err := store.Advance(msg.Context(), tx, consumer, d.Subject, d.SubjectSeq)
			if err != nil {
				return nil, err
			}
			if !advanced {
				stateOf(msg).stale = true
				return nil, nil
			}
			return next(msg)
		}
	}
}
