package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// errOverLimit rolls back the probe of a message over the delivery limit.
var errOverLimit = errors.New("over the delivery limit")

// deliveryGuard stops a message that never finishes, typically because it
// kills the process on every delivery, from looping forever. It keeps a
// durable count of deliveries per (consumer, event), written in a short
// transaction of its own before the attempts, and fails permanently with
// code delivery_limit once the count passes maxDeliveries.
//
// Where the transport tells a first delivery from a redelivery (see
// framework.MetadataRedelivered), a first delivery costs nothing: only
// redeliveries are counted, the first one as the second delivery. Where it
// cannot tell, every delivery is counted. The count is forgotten in the
// transaction that commits the effect.
//
// A first delivery that the runner hands back unhandled (its stop
// refused it, it waited for its subject's turn) was recorded at zero
// before its nack (driver.Store.Count with first 0): its redelivery
// counts as the first, so neither a stop nor a rebalance is charged,
// even at maxDeliveries 1.
//
// A redelivery is a suspect: it may be the message that killed the
// process. The suspects of one guard (one consumer's chain) run one at a
// time in this process: a suspect waits for its turn before it is
// counted, and holds the turn through its attempts. So when a crasher
// kills the process again, only the suspect that was running is counted,
// not the messages in flight beside it, which would otherwise reach the
// limit with it; the first deliveries among them cost nothing and come
// back as suspects. A suspect whose context ends while it waits is nacked,
// uncounted. The cost: after a crash, or an outage that nacked many
// messages, the redeliveries are handled one at a time until they drain.
// Deliveries the transport cannot classify run as before, concurrently.
//
// A delivery that the service's stop ended after an attempt that ran to
// its end, before a further attempt (errStopping), is taken back in a
// short transaction of its own (driver.Store.Uncount): a stop charges
// nothing, so a message whose attempts fail (an outage) reaches the limit
// no sooner however often the service restarts meanwhile. A delivery
// whose attempt the stop cut short (the stop's time ran out) stays
// counted: the guard cannot tell it from one that hangs, which must reach
// the limit.
//
// A failure to count is returned as a plain error: the message is not
// dead-lettered but delivered again later. The count is keyed as the dead
// letter is (see deadLetter): by the event's key, which decode made sure
// every store can hold; an event whose key fails framework.Key.Validate
// (in a chain without decode) fails permanently with its code, and its
// dead letter is keyed by the body.
//
// With uow, it tells a message over the limit whose effect did commit (a
// burst of copies of one event) from one that never took effect: the
// first is acknowledged as a duplicate, only the second is dead-lettered.
// Without it every message over the limit is dead-lettered.
func deliveryGuard(consumer string, store driver.Store, maxDeliveries int, timeout time.Duration, uow *driver.UnitOfWork, acker driver.TxAcker, stopping <-chan struct{}) message.HandlerMiddleware {
	g := &guard{
		consumer: consumer, store: store, maxDeliveries: maxDeliveries, timeout: timeout, uow: uow, acker: acker,
		handling: newHandling(), suspects: newTurn(), stopping: stopping,
	}
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if redelivered, known := pipeline.Redelivered(msg); known && !redelivered {
				ctx := msg.Context() // the inner steps set contexts of their own
				d, err := eventOf(ctx)
				if err != nil {
					return nil, err
				}
				stateOf(msg).deliveries = 1 // known without counting, for the dead letter
				out, err := next(msg)       // a first delivery costs nothing
				if uncharged(err) {
					err = g.uncount(ctx, d.Key(), err)
				}
				return out, err
			}
			return g.count(msg, next)
		}
	}
}

// guard is the delivery guard of one consumer's chain.
type guard struct {
	consumer      string
	store         driver.Store
	maxDeliveries int
	// timeout is an attempt's (Settings.Timeout): the limit of the
	// transaction that takes the mark of a delivery over the limit, an
	// attempt whose handler does not run, as the timeout step bounds
	// every other attempt. The message's context has no end of its own.
	timeout  time.Duration
	uow      *driver.UnitOfWork
	acker    driver.TxAcker // acks a duplicate over the limit in its transaction (see unitOfWork)
	handling *handling
	suspects turn
	stopping <-chan struct{} // closed once the service stops (see retry)
}

// count counts the delivery of msg, which may be a redelivery, and runs
// next unless the delivery is over the limit. It is a function of its own
// so that the step's stack frame stays small for first deliveries.
func (g *guard) count(msg *message.Message, next message.HandlerFunc) ([]*message.Message, error) {
	d, err := eventOf(msg.Context())
	if err != nil {
		return nil, err
	}
	_, known := pipeline.Redelivered(msg)
	key := d.Key()
	if err := key.Validate(); err != nil {
		// decode refuses such a key, a chain without it may not:
		// no store could count it, so the message is poison, its
		// dead letter keyed by its body (see deadLetter).
		return nil, fmt.Errorf("count delivery: %w", err)
	}
	first := 1
	release := func() {}
	if known {
		// A suspect: its turn comes before its count, so that one
		// waiting when the process dies is not counted.
		first = 2
		var err error
		if release, err = g.suspects.take(msg.Context()); err != nil {
			return nil, fmt.Errorf("wait for the turn of redelivered %s: %w", key, err)
		}
		defer release()
	}
	// Registered before the count: a copy counted after this one
	// sees it handling.
	leave := g.handling.enter(key)
	defer func() { leave() }()
	st := stateOf(msg)
	n, err := g.countDelivery(msg.Context(), st, key, first)
	if err != nil {
		return nil, fmt.Errorf("count delivery of %s: %w", key, err)
	}
	st.deliveries = n // for the dead letter
	st.counted = true // the unit of work forgets the count
	if err := st.dies(msg.Context(), crash.AfterCount); err != nil {
		return nil, err
	}
	ctx := msg.Context()
	if n > g.maxDeliveries {
		leave()
		// The handler does not run: the next suspect may, and a
		// copy this one waits for below never waits for it.
		release()
		if g.uow != nil {
			// Copies of the event that this process is handling
			// (a burst of one event on a transport that cannot tell
			// redeliveries) may take effect yet: wait for them, then
			// take the processed mark without running the handler.
			// A copy whose event took effect is a duplicate, and its
			// count goes.
			if err := g.handling.waitNone(ctx, key); err != nil {
				return nil, fmt.Errorf("check delivery limit of %s: %w", key, err)
			}
			dctx, cancel := context.WithTimeout(ctx, g.timeout)
			outcome, err := g.uow.DoDelivery(dctx, g.consumer, key, delivery(st, g.acker, nil, msg), func(context.Context) error { return errOverLimit })
			cancel()
			if outcome == framework.Duplicate {
				st.outcome = framework.Duplicate
				return nil, nil
			}
			if err != nil && !errors.Is(err, errOverLimit) {
				return nil, fmt.Errorf("check delivery limit of %s: %w", key, err)
			}
		}
		return nil, framework.Permanent(framework.CodeDeliveryLimit,
			fmt.Errorf("%s delivered %d times, at most %d allowed", key, n, g.maxDeliveries))
	}
	out, err := next(msg)
	if uncharged(err) || pipeline.LostTurn(err) { // the latter runs again, counted again
		err = g.uncount(ctx, key, err)
	}
	return out, err
}

// countDelivery counts the delivery of key, of state st (see
// driver.Store.Count). While the count fails for an outage of the
// database (see pauseFor), it pauses as the attempts do, and counts
// again: nacked, the message would come back sooner than the database
// and fail again, and on RabbitMQ each nack lengthens the pause before
// the subscription's next redelivery.
func (g *guard) countDelivery(ctx context.Context, st *state, key framework.Key, first int) (int, error) {
	n, err := g.store.Count(ctx, g.consumer, key, first)
	for err != nil && g.uow != nil {
		reason := pauseFor(ctx, err, g.uow.Ping)
		if reason == "" {
			break
		}
		if err := awaitOutage(ctx, st, reason, g.uow.Ping, g.stopping, 0, err); err != nil {
			return 0, err
		}
		n, err = g.store.Count(ctx, g.consumer, key, first)
	}
	st.resume()
	return n, err
}

// uncount takes back the delivery of key, which the service's stop ended
// with err (errStopping) after an attempt that ran to its end, or a
// rebalance (errHandedBack): it does
// not count towards the limit (driver.Store.Uncount). When that fails
// the delivery stays counted, and the error says so beside err.
func (g *guard) uncount(ctx context.Context, key framework.Key, err error) error {
	if uerr := g.store.Uncount(ctx, g.consumer, key); uerr != nil {
		return errors.Join(err, fmt.Errorf("the delivery stays counted: %w", uerr))
	}
	return err
}

// handling counts, per event, the deliveries this process is handling
// under the delivery limit, so that a copy over the limit can wait for
// them.
type handling struct {
	mu   sync.Mutex
	keys map[framework.Key]*handlingKey
}

type handlingKey struct {
	n    int
	none chan struct{} // closed when n drops to 0
}

func newHandling() *handling {
	return &handling{keys: make(map[framework.Key]*handlingKey)}
}

// enter registers one delivery of key and returns its leave, which may be
// called more than once.
func (h *handling) enter(key framework.Key) (leave func()) {
	h.mu.Lock()
	k, ok := h.keys[key]
	if !ok {
		k = &handlingKey{none: make(chan struct{})}
		h.keys[key] = k
	}
	k.n++
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if k.n--; k.n == 0 {
				close(k.none)
				delete(h.keys, key)
			}
		})
	}
}

// waitNone waits until no delivery of key is handled, or ctx ends.
func (h *handling) waitNone(ctx context.Context, key framework.Key) error {
	h.mu.Lock()
	k, ok := h.keys[key]
	h.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-k.none:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// turn lets one delivery at a time through: a semaphore of one.
type turn chan struct{}

func newTurn() turn { return make(turn, 1) }

// take waits for the turn, or until ctx ends, and returns its release,
// which may be called more than once.
func (t turn) take(ctx context.Context) (release func(), err error) {
	select {
	case t <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() { once.Do(func() { <-t }) }, nil
}
