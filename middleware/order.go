package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
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
// event further ahead is parked when an earlier event of its subject is a
// dead letter (held, see gapWait) or parked (dead-lettered with
// CodeSequenceConflict when another event holds its place), and otherwise
// waits: it is
// delivered again later, and parked once it has waited GapPark (see
// gapWait, which sits outside the unit of work). A parked event is
// acknowledged without its processed mark, in the attempt's transaction;
// releaseParked applies it once its turn comes. A subject's sequence
// starts at 1: its first event waits for #1 like any other, unless
// fromFirstSeen, when the first event seen of a subject starts its
// sequence, whatever its number, unless it is parked. Events without
// subject or subjectseq pass through.
func strictOrder(consumer string, store driver.Store, fromFirstSeen bool) message.HandlerMiddleware {
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
			tx, ok := pipeline.From[*driver.Tx](ctx)
			if !ok {
				return nil, errors.New("strict order: no attempt transaction: place it inside unitOfWork")
			}
			st := stateOf(msg)
			st.parked = false // this attempt decides again
			var c int64
			step := orderStep(ctx)
			if step != nil {
				c = step.Checkpoint // read and locked by the batch
			} else if c, err = store.Checkpoint(ctx, tx, consumer, d.Subject); err != nil {
				return nil, err
			}
			started := c != 0 || !fromFirstSeen // else the first event seen starts it
			switch n := d.SubjectSeq; {
			case n <= c:
				st.stale = true
				return nil, endWait(ctx, store, tx, st, consumer, d.Subject, n, d.Key())
			case !started || n > c+1:
				parked, err := store.Park(ctx, tx, driver.ParkedEvent{
					Consumer: consumer, Subject: d.Subject, Seq: n, Key: d.Key(),
					Topic: message.SubscribeTopicFromCtx(ctx), Body: msg.Payload, Metadata: msg.Metadata,
				})
				if errors.Is(err, driver.ErrSequenceTaken) {
					// Another event claimed the step: its dead letter
					// holds nothing (see driver.Store.HoldDeadLetter).
					return nil, framework.Permanent(framework.CodeSequenceConflict, err)
				}
				if err != nil {
					return nil, err
				}
				if parked {
					st.parked = true
					st.signalRelease(d.Subject) // in case the dead letter took effect meanwhile
					return nil, nil
				}
				if started {
					return nil, &gapError{subject: d.Subject, seq: n, checkpoint: c}
				}
			}
			out, err := next(msg)
			if err != nil {
				return out, err
			}
			if step != nil {
				// The batch moves the checkpoint before its commit, with
				// its other attempts', and runs them again alone if one
				// of their subjects has a wait or a parked event.
				step.Advance, step.Seq = true, d.SubjectSeq
				return out, nil
			}
			return out, advance(ctx, store, tx, st, consumer, d.Subject, d.SubjectSeq, d.Key())
		}
	}
}

// orderStep returns the strict-order step of the attempt of ctx when its
// batch read and locked its subject's checkpoint (see
// driver.Delivery.OrderedSubject); nil otherwise.
func orderStep(ctx context.Context) *pipeline.OrderStep {
	at, ok := pipeline.From[pipeline.Attempt](ctx)
	if !ok {
		return nil
	}
	return at.Order
}

// advanceEndWaiter is a Store that moves a checkpoint and ends the wait
// of the event that moved it in one round trip (the SQL stores do).
type advanceEndWaiter interface {
	AdvanceEndWait(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64, key framework.Key) (bool, error)
}

// advance moves the checkpoint of (consumer, subject) to seq, the event
// key's, which took effect at its turn, in tx, then ends its wait as
// endWait does.
func advance(ctx context.Context, store driver.Store, tx *driver.Tx, st *state, consumer, subject string, seq int64, key framework.Key) error {
	a, ok := store.(advanceEndWaiter)
	if !ok {
		if _, err := store.Advance(ctx, tx, consumer, subject, seq); err != nil {
			return err
		}
		return endWait(ctx, store, tx, st, consumer, subject, seq, key)
	}
	parked, err := a.AdvanceEndWait(ctx, tx, consumer, subject, seq, key)
	return waitEnded(st, subject, parked, err)
}

// endWait ends the wait, hold or parking of (consumer, subject, seq) in
// tx, and asks releaseParked to release what its effect lets through.
// When another event holds seq, the event key claimed its step: it is a
// dead letter (CodeSequenceConflict), its effect rolled back.
func endWait(ctx context.Context, store driver.Store, tx *driver.Tx, st *state, consumer, subject string, seq int64, key framework.Key) error {
	parked, err := store.EndWait(ctx, tx, consumer, subject, seq, key)
	return waitEnded(st, subject, parked, err)
}

// waitEnded is the chain's side of the end of a wait (Store.EndWait):
// another event's step is a dead letter, CodeSequenceConflict; events
// parked after it are for releaseParked.
func waitEnded(st *state, subject string, parked bool, err error) error {
	if errors.Is(err, driver.ErrSequenceTaken) {
		return framework.Permanent(framework.CodeSequenceConflict, err)
	}
	if parked {
		st.signalRelease(subject)
	}
	return err
}

// GapPark is how long an event waits for an earlier one of its subject,
// under strict order, delivered again by its transport, before it is
// parked (see gapWait).
const GapPark = time.Second

// gapWait turns the wait of an event behind a gap (see strictOrder) into
// a nack, so that the transport delivers the event
// again later; once the event has waited GapPark, into its parking
// (driver.Store.ParkGap): acknowledged, its message kept, applied by
// releaseParked as soon as its turn comes; and once it has waited longer
// than timeout, into a permanent error with code sequence_gap (the sweep
// of releaseParked hands a parked event to the chain again for that).
// Parking frees what a waiting message holds of its transport (a slot of
// the consumer's concurrency, the prefetch, on watermill-sql the whole
// topic): waiting events that fill it would keep back the very events
// they wait for, which a transport that puts a nacked message back at
// the head of its queue delivers only after them. It records the wait
// and the parking in transactions of their own, after the attempt's
// rolled back, so it sits outside the unit of work and inside decode. A
// wait does not count towards the delivery limit.
func gapWait(consumer string, store driver.Store, timeout time.Duration) message.HandlerMiddleware {
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
				if waited < GapPark {
					return nil, err
				}
				parked, perr := store.ParkGap(ctx, driver.ParkedEvent{
					Consumer: consumer, Subject: gap.subject, Seq: gap.seq, Key: d.Key(),
					Topic: message.SubscribeTopicFromCtx(ctx), Body: msg.Payload, Metadata: msg.Metadata,
				})
				if errors.Is(perr, driver.ErrSequenceTaken) {
					return nil, framework.Permanent(framework.CodeSequenceConflict, perr) // see strictOrder
				}
				if perr != nil {
					return nil, errors.Join(err, perr)
				}
				if !parked {
					return nil, err // its turn came meanwhile: delivered again, it takes effect
				}
				stateOf(msg).parked = true
				return nil, nil
			}
			// Not wrapping gap, which is ErrLater: this is the end of the
			// wait, which the dead letter's transaction removes.
			return nil, framework.Permanent(framework.CodeSequenceGap, gapEnded{fmt.Errorf("%s, for longer than %s", gap.Error(), timeout)})
		}
	}
}

// gapEnded is the error of an event whose wait for an earlier one of its
// subject ran past the gap timeout: its dead letter (sequence_gap) does
// not hold the subject. The dead-letter step tells it by this type, not
// by its code, which a handler may give its own permanent error too: that
// one holds the subject like any other dead letter.
type gapEnded struct{ error }

func (e gapEnded) Unwrap() error { return e.error }

// DefaultReleaseSweep is how often, at most, a consumer under strict
// order looks for parked events whose turn came while none of its
// messages let them through: after a crash between an effect and the
// release it allowed, or after an operator discarded a dead letter.
const DefaultReleaseSweep = time.Minute

// signalRelease asks releaseParked to release the parked events of
// subject whose turn has come, once the message's chain returns.
func (s *state) signalRelease(subject string) {
	if !slices.Contains(s.release, subject) {
		s.release = append(s.release, subject)
	}
}

// releaser applies parked events whose turn has come, and hands those
// that waited too long for an earlier event to the chain again (see
// releaseParked).
type releaser struct {
	consumer   string
	store      driver.Store
	logger     *slog.Logger
	now        func() time.Time
	every      time.Duration
	gapTimeout time.Duration
	nextSweep  atomic.Int64 // Unix nanoseconds; 0 before the first sweep
	// next is the chain inside the releaser, once middleware wrapped it:
	// what run hands the parked events to.
	next atomic.Pointer[message.HandlerFunc]
}

func newReleaser(consumer string, store driver.Store, logger *slog.Logger, now func() time.Time, every, gapTimeout time.Duration) *releaser {
	return &releaser{consumer: consumer, store: store, logger: logger, now: now, every: every, gapTimeout: gapTimeout}
}

// middleware is the step releaseParked, the outermost under strict
// order. Once the chain of a message returns, it applies the events parked behind a dead letter
// that the message's effect let through (see strictOrder): one after the
// other, in sequence, each through the whole chain as a delivery of its
// own (its attempts, its retries, and its dead letter if it fails, which
// parks the rest again). A released event that takes effect leaves the
// parked events in the transaction of its effect, so a crash at any point
// loses none and applies none twice: what is left is released by the
// next message of the subject, or by the sweep that the first message
// after start, then one message every DefaultReleaseSweep, runs for the
// whole consumer (or run, while no message comes). The sweep also hands to the chain again the first
// parked event of each subject that waits for an earlier event that has
// not arrived (no dead letter before it) since longer than gapTimeout,
// where it ends as sequence_gap (see gapWait).
//
// The released events carry the message's crash hook (see package
// internal/crash): a released event that dies there takes the process
// with it, so the message's chain returns its *crash.Died, unacknowledged,
// and nothing more is released or swept.
func (r *releaser) middleware(next message.HandlerFunc) message.HandlerFunc {
	r.next.Store(&next)
	return func(msg *message.Message) ([]*message.Message, error) {
		st := stateOf(msg)
		ctx := msg.Context()
		out, err := next(msg)
		if err == nil {
			for _, subject := range st.release {
				if derr := r.release(ctx, next, subject); derr != nil {
					return nil, derr
				}
			}
		}
		if r.sweepDue() {
			if derr := r.sweep(ctx, next); derr != nil {
				return nil, derr
			}
		}
		return out, err
	}
}

// run sweeps (see middleware) until ctx ends: at once, then whenever
// no message has for r.every, looking four times as often, so that a
// consumer that receives nothing still releases and expires its parked
// events (Handler).
func (r *releaser) run(ctx context.Context) {
	tick := time.NewTicker(max(r.every/4, time.Millisecond))
	defer tick.Stop()
	for {
		if next := r.next.Load(); next != nil && r.sweepDue() {
			_ = r.sweep(ctx, *next) // ctx carries no crash hook: nothing dies
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sweepDue reports whether this message runs the sweep: one message does,
// at most every r.every.
func (r *releaser) sweepDue() bool {
	now := r.now().UnixNano()
	due := r.nextSweep.Load()
	return now >= due && r.nextSweep.CompareAndSwap(due, now+int64(r.every))
}

// sweep releases the parked events of every subject whose turn has come,
// and expires those that waited too long. It returns the *crash.Died of
// an event that died, nil otherwise.
func (r *releaser) sweep(ctx context.Context, next message.HandlerFunc) error {
	ready, err := r.store.Parked(ctx, driver.ParkedFilter{Consumer: r.consumer, Ready: true})
	if err != nil {
		if ctx.Err() != nil {
			return nil // shutdown: the next start sweeps
		}
		r.logger.ErrorContext(ctx, "list the parked events whose turn came; they are released later",
			slog.String("consumer", r.consumer), slog.Any("error", err))
		return nil
	}
	for _, p := range ready {
		if err := r.release(ctx, next, p.Subject); err != nil {
			return err
		}
	}
	return r.expire(ctx, next)
}

// expire hands to next, as a message of its own, the first parked event
// of each subject that waits for an earlier event that has not arrived,
// neither held nor ready, once it has waited longer than the gap
// timeout: gapWait dead-letters it with code sequence_gap, as it would
// a delivery (it measures the wait by the store's clock, from its start).
// It returns the *crash.Died of an event that died, nil otherwise.
func (r *releaser) expire(ctx context.Context, next message.HandlerFunc) error {
	ps, err := r.store.Parked(ctx, driver.ParkedFilter{Consumer: r.consumer})
	if err != nil {
		if ctx.Err() == nil {
			r.logger.ErrorContext(ctx, "list the parked events that wait for an earlier one; they are looked at later",
				slog.String("consumer", r.consumer), slog.Any("error", err))
		}
		return nil
	}
	for i, p := range ps {
		if i > 0 && ps[i-1].Subject == p.Subject || p.Held || p.Ready || r.now().Sub(p.At) <= r.gapTimeout {
			continue // not its subject's first, behind a dead letter, its turn came, or not for long
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := r.apply(ctx, next, p); err != nil {
			if died(err) {
				return err
			}
			r.logger.InfoContext(ctx, "a parked event that waited too long was not handled; it is looked at again later",
				slog.String("consumer", r.consumer), slog.String("subject", p.Subject), slog.Int64("seq", p.Seq),
				slog.Any("error", err))
		}
	}
	return nil
}

// release applies the parked events of subject whose turn has come, in
// sequence, until one does not take effect. It returns the *crash.Died
// of an event that died, nil otherwise.
func (r *releaser) release(ctx context.Context, next message.HandlerFunc, subject string) error {
	var last int64
	for ctx.Err() == nil {
		ps, err := r.store.Parked(ctx, driver.ParkedFilter{Consumer: r.consumer, Subject: subject, Ready: true, Limit: 1})
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutdown: the next start sweeps
			}
			r.logger.ErrorContext(ctx, "find the next parked event; it is released later",
				slog.String("consumer", r.consumer), slog.String("subject", subject), slog.Any("error", err))
			return nil
		}
		if len(ps) == 0 {
			return nil
		}
		p := ps[0]
		if p.Seq <= last {
			// It was handled without taking effect (a duplicate of
			// a processed event): an operator must look at it.
			r.logger.ErrorContext(ctx, "a released event stays parked: it did not take effect",
				slog.String("consumer", r.consumer), slog.String("subject", subject), slog.Int64("seq", p.Seq),
				slog.String("source", p.Key.Source), slog.String("id", p.Key.ID))
			return nil
		}
		last = p.Seq
		if err := r.apply(ctx, next, p); err != nil {
			if died(err) {
				return err
			}
			r.logger.InfoContext(ctx, "a released event was not handled; it stays parked and is released later",
				slog.String("consumer", r.consumer), slog.String("subject", subject), slog.Int64("seq", p.Seq),
				slog.Any("error", err))
			return nil
		}
	}
	return nil
}

// apply hands the parked event p to next as a message of its own, with
// its body and metadata (but the transport's redelivery marker), and
// returns the chain's error. The message's context ends with ctx and
// carries nothing of it but its crash hook.
func (r *releaser) apply(ctx context.Context, next message.HandlerFunc, p driver.ParkedEvent) error {
	m := message.NewMessage(watermill.NewUUID(), p.Body)
	for k, v := range p.Metadata {
		if k != framework.MetadataRedelivered { // this delivery is a first
			m.Metadata.Set(k, v)
		}
	}
	base := context.Background()
	if h := crash.HookOf(ctx); h != nil {
		base = crash.With(base, h)
	}
	mctx, cancel := context.WithCancel(base)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	m.SetContext(mctx)
	_, err := next(m)
	return err
}
