package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// deadLetter hands messages that will not be processed to store
// and acknowledges them once it stored them: those that failed permanently
// (poison, a permanent handler error, the delivery limit) and those whose
// attempts all failed. The dead letter records a code (framework.CodeOf),
// never the error's text, which may quote payload data.
//
// It never dead-letters on shutdown: when the message context ended, or
// retry started no further attempt because the service is stopping
// (errStopping), the error is returned and the message is delivered again
// later; the same for pipeline.ErrLater. An error that wraps
// context.Canceled while the message context is alive is no shutdown's:
// a handler's own (a client of its own canceled), it is dead-lettered
// once the attempts are spent, as any other. Nor does it dead-letter an error
// that is not permanent and did not come from retry giving up (a failure
// to count the delivery, an Outer middleware's transient error): that
// message is delivered again, and counts towards the delivery limit. When storing
// the dead letter fails, the message is not acknowledged.
//
// A dead letter never depends on the attribute that failed: a message that
// did not decode is keyed by its source and id only when decode would take
// both, else by the hash of its body (framework.BodyKey); its body is
// kept byte for byte and its metadata as driver.StorableMetadata. So
// no store refuses it whatever the input, and the message is not
// delivered again forever.
//
// Under strict order (holds) a dead letter of any code but sequence_gap
// holds its subject, so that the later events of the subject are parked
// behind it (see strictOrder); the hold and the dead letter are one
// transaction (driver.Store.HoldDeadLetter), so that a released
// event, whose parking is the only copy of its message, stays parked
// until its dead letter is stored. A sequence_gap dead letter holds
// nothing: the event it waited for never came, and the next ones may.
// The dead letter's times are now's.
func deadLetter(consumer string, store driver.Store, now func() time.Time, holds bool) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			ctx := msg.Context()
			out, err := next(msg)
			msg.SetContext(ctx)
			if err == nil {
				return out, nil
			}
			return nil, failed(ctx, consumer, store, now, holds, msg, st, err)
		}
	}
}

// failed is what the dead-letter step returns for msg, whose state is st
// and whose chain failed with err: err, or nil once it stored the dead
// letter. It is a function of its own so that the step's stack frame
// stays small on the way in, where every message passes.
func failed(ctx context.Context, consumer string, store driver.Store, now func() time.Time, holds bool, msg *message.Message, st *state, err error) error {
	if ctx.Err() != nil || errors.Is(err, pipeline.ErrLater) {
		return err // shutdown, or a wait: deliver again later
	}
	if !framework.IsPermanent(err) && !st.gaveUp {
		return err // before the attempts, or after they succeeded
	}
	if settledBefore(ctx, consumer, store, msg, st) {
		st.outcome = framework.Duplicate
		return nil
	}
	if derr := st.dies(ctx, crash.BeforeDeadLetter); derr != nil {
		return derr
	}
	dl := newDeadLetter(consumer, msg, st, framework.CodeOf(err), now().UTC())
	publish := store.PublishDeadLetter
	var ended gapEnded
	if holds && !errors.As(err, &ended) {
		publish = store.HoldDeadLetter
	}
	if perr := publish(ctx, dl); perr != nil {
		return fmt.Errorf("store dead letter (%s) of %s: %w", dl.Code, dl.Key(), errors.Join(perr, err))
	}
	st.deadLettered, st.cause, st.deadLetterKey = dl.Code, err, dl.Key()
	return nil
}

// settledBefore reports whether the message of st, which did not route
// (it did not decode, its data did not decode or validate, its type or
// version has no handler), is an event that consumer already settled: it
// processed it (a redelivery after a deploy that validates more strictly,
// or the replay of a dead-lettered copy whose event a later copy
// applied), or an operator discarded its dead letter (a copy of the same
// bytes, which a discard settles for good: see driver.Store.Mark). Such a
// message is a duplicate, as it would be had it routed: the unit of work
// meets its mark, or takes none, before its handler runs. A message that
// routed is not asked about: its unit of work decided. The event is the
// one its dead letter would be keyed by (messageKey). Only a store that
// reads a mark outside a transaction is asked; a failed read leaves the
// message to its dead letter.
func settledBefore(ctx context.Context, consumer string, store driver.Store, msg *message.Message, st *state) bool {
	if st.decoded != nil {
		return false
	}
	p, ok := store.(driver.Peeker)
	if !ok {
		return false
	}
	settled, _, err := p.Peek(ctx, consumer, messageKey(msg, st), "")
	return err == nil && settled
}

// newDeadLetter builds the dead letter of msg, failed at now. Nothing in
// it depends on an attribute that failed: its key is messageKey's, its
// event attributes (subject sequence included) come from an envelope that
// decode accepted, its body is the message's bytes and its metadata
// driver.StorableMetadata of the message's. Its Deliveries is the
// delivery guard's count of this delivery, 0 when the guard did not count
// it (a first delivery that the transport vouched for).
func newDeadLetter(consumer string, msg *message.Message, st *state, code framework.Code, now time.Time) driver.DeadLetter {
	key := messageKey(msg, st)
	dl := driver.DeadLetter{
		Consumer:      consumer,
		Topic:         message.SubscribeTopicFromCtx(msg.Context()),
		Source:        key.Source,
		EventID:       key.ID,
		Code:          code,
		Attempts:      st.attempts,
		Deliveries:    st.deliveries,
		FirstFailedAt: now,
		LastFailedAt:  now,
		Body:          msg.Payload,
		Metadata:      driver.StorableMetadata(msg.Metadata),
		Status:        driver.DeadLetterPending,
	}
	if env := st.envelope; env != nil && env.Key() == key {
		dl.Type, dl.Version = env.Type, env.Version
		dl.Subject, dl.SubjectSeq, dl.CorrelationID = env.Subject, env.SubjectSeq, env.CorrelationID
	}
	return dl
}

// messageKey returns the key under which the chain counts the deliveries
// of msg (deliveryGuard) and keeps its dead letter: the decoded event's key
// when it passes framework.Key.Validate (decode makes sure it does), else
// framework.BodyKey of the body, which is the body's hash when its source
// and id are not usable. One rule for both, so that whatever the input no
// store refuses the key, and the dead letter forgets the count of its own
// message.
func messageKey(msg *message.Message, st *state) framework.Key {
	if env := st.envelope; env != nil && env.Key().Validate() == nil {
		return env.Key()
	}
	return framework.BodyKey(msg.Payload)
}
