package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// gapError says that an event waits for an earlier one of its subject. It
// is ErrLater: not retried now, not dead-lettered, delivered again later.
type gapError struct {
	subject         string
	seq, checkpoint int64
}

func (e *gapError) Error() string {
	return fmt.Sprintf("%s #%d waits for #%d", e.subject, e.seq, e.checkpoint+1)
}

func (e *gapError) Unwrap() error { return pipeline.ErrLater }

// strictOrder applies the events of a subject (CloudEvents subject and
// subjectseq) one after the other, in sequence, inside the attempt's
// transaction: the event that follows the subject's checkpoint takes
// effect and moves it; an event at or below it is stale and skipped; an
// event further ahead waits, it is delivered again later (see gapWait,
// which sits outside the unit of work). The first event seen of a
// subject starts its sequence, whatever its number. Events without subject
// or subjectseq pass through.
func strictOrder(consumer string, store framework.Store) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, err := eventOf(msg.Context())
			if err != nil {
				return nil, err
			}
			if d.Subject == "" || d.SubjectSeq == 0 {
				return next(msg)
			}
			ctx := msg.Context()
			tx, ok := pipeline.From[*framework.Tx](ctx)
			if !ok {
				return nil, errors.New("strict order: no attempt transaction: place it inside unitOfWork")
			}
			c, err := store.Checkpoint(ctx, tx, consumer, d.Subject)
			if err != nil {
				return nil, err
			}
			switch n := d.SubjectSeq; {
			case c != 0 && n <= c:
				stateOf(msg).stale = true
				return nil, store.EndWait(ctx, tx, consumer, d.Subject, n)
			case c != 0 && n > c+1:
				return nil, &gapError{subject: d.Subject, seq: n, checkpoint: c}
			}
			out, err := next(msg)
			if err != nil {
				return out, err
			}
			if _, err := store.Advance(ctx, tx, consumer, d.Subject, d.SubjectSeq); err != nil {
				return nil, err
			}
			return out, store.EndWait(ctx, tx, consumer, d.Subject, d.SubjectSeq)
		}
	}
}

// gapWait turns the wait of an event behind a gap (see strictOrder) into
// either a nack, so that the transport delivers the event again later, or,
// once it has waited longer than timeout, a permanent error with code
// sequence_gap. It records the wait in a transaction of its own, after the
// attempt's rolled back, so it sits outside the unit of work and inside
// decode. A wait does not count towards the delivery limit.
func gapWait(consumer string, store framework.Store, timeout time.Duration) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context() // the inner steps leave theirs behind, ended
			out, err := next(msg)
			msg.SetContext(ctx)
			var gap *gapError
			if !errors.As(err, &gap) {
				return out, err
			}
			d, derr := eventOf(ctx)
			if derr != nil {
				return nil, derr
			}
			waited, werr := store.WaitGap(ctx, consumer, gap.subject, gap.seq, d.Key(), msg.Payload)
			if werr != nil {
				return nil, errors.Join(err, werr)
			}
			if waited <= timeout {
				return nil, err
			}
			if werr := store.EndWait(ctx, nil, consumer, gap.subject, gap.seq); werr != nil {
				return nil, errors.Join(err, werr)
			}
			// Not wrapping gap, which is ErrLater: this is the end of the wait.
			return nil, framework.Permanent(framework.CodeSequenceGap, fmt.Errorf("%s, for longer than %s", gap.Error(), timeout))
		}
	}
}
