package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/middleware"
)

// Result is what happened to one delivery.
type Result struct {
	// Outcome is what the chain did with the message: framework.Processed,
	// Duplicate, Stale (the sequence guard skipped an event older than its
	// subject's checkpoint, Config.SkipStale), DeadLettered, Nacked (a
	// transport would deliver it again: the attempt was cut short by its
	// context, the event waits for an earlier one under
	// Config.StrictOrder, or the dead letter could not be stored), or
	// Crashed (the delivery died at a crash point, see DeliverCrashing).
	Outcome framework.Outcome
	// Code says why the message was dead-lettered; empty otherwise.
	Code framework.Code
	// Attempts is the number of attempts made, a duplicate's included: 0
	// for poison and for a delivery over the limit, which never reach the
	// retries.
	Attempts int
	// Err is the error the chain returned to the transport when it nacked
	// the message or the delivery died; nil otherwise.
	Err error
	// CrashedAt is the crash point where the delivery died when Crashed:
	// its own, or that of a delivery of its batch under group commit.
	CrashedAt CrashPoint
}

// Acked reports whether the transport would acknowledge the message.
func (r Result) Acked() bool { return r.Outcome != framework.Nacked && r.Outcome != Crashed }

// String describes the result, e.g. "dead_lettered (retries_exhausted)
// after 3 attempts".
func (r Result) String() string {
	var b strings.Builder
	b.WriteString(string(r.Outcome))
	if r.CrashedAt != "" {
		fmt.Fprintf(&b, " at %s", r.CrashedAt)
		return b.String()
	}
	if r.Code != "" {
		fmt.Fprintf(&b, " (%s)", r.Code)
	}
	fmt.Fprintf(&b, " after %d attempts", r.Attempts)
	if r.Err != nil {
		fmt.Fprintf(&b, ": %v", r.Err)
	}
	return b.String()
}

// Results are the results of deliveries made together.
type Results []Result

// Count returns how many results have outcome o.
func (rs Results) Count(o framework.Outcome) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// Chain is a consumer behind the framework's whole chain on the kit's
// database: what the app runs for it, without a transport. Deliver hands
// it messages the way a transport's subscriber does.
type Chain struct {
	kit      *Kit
	consumer *framework.Consumer
	handler  message.NoPublishHandlerFunc // the chain, shared by every delivery
}

// Chain returns the consumer name with handlers behind the chain (see
// framework.NewConsumer), failing the test when the name or the handlers
// are invalid.
func (k *Kit) Chain(t testing.TB, name string, handlers ...framework.Handler) *Chain {
	t.Helper()
	c, err := framework.NewConsumer(name, handlers...)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	return k.ConsumerOf(t, c)
}

// ConsumerOf puts c, built by the application's own code, behind the
// chain.
func (k *Kit) ConsumerOf(t testing.TB, c *framework.Consumer) *Chain {
	t.Helper()
	if c == nil {
		t.Fatalf("testkit: nil consumer (build it with framework.NewConsumer)")
		return nil
	}
	tc := &Chain{kit: k, consumer: c}
	h, sweep, err := tc.chain()
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	tc.handler = h
	// The chain's sweep runs as in a service (see middleware.Handler),
	// until the test ends, before the kit's database closes (cleanups
	// run last registered first).
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sweep(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return tc
}

// Name returns the consumer's name.
func (c *Chain) Name() string { return c.consumer.Name() }

// Deliver encodes env as a transport's message and runs it through the
// chain, returning what became of it. It fails the test when env does not
// encode (use DeliverBody for a body that breaks the wire format) or the
// chain cannot report an outcome.
//
// Like a transport that cannot tell a redelivery (watermill-sql), the
// message carries no redelivered flag, so the delivery guard counts every
// delivery. Messages have no subscribe topic: the Topic of their dead
// letters is empty.
func (c *Chain) Deliver(ctx context.Context, t testing.TB, env framework.Envelope) Result {
	t.Helper()
	msg, err := framework.NewMessage(env)
	if err != nil {
		t.Fatalf("testkit: encode %s (use DeliverBody to deliver a malformed event): %v", env.Key(), err)
		return Result{}
	}
	return c.DeliverMessage(ctx, t, msg)
}

// DeliverBody delivers body as it is, for poison: a body that is not a
// CloudEvent, one that is too large, or one with data that does not
// validate.
func (c *Chain) DeliverBody(ctx context.Context, t testing.TB, body []byte) Result {
	t.Helper()
	return c.DeliverMessage(ctx, t, message.NewMessage(watermill.NewUUID(), body))
}

// DeliverMessage runs msg through the chain as it is, for a test that
// sets metadata, such as framework.MetadataRedelivered. The message's
// context becomes ctx; a message must not be delivered twice.
func (c *Chain) DeliverMessage(ctx context.Context, t testing.TB, msg *message.Message) Result {
	t.Helper()
	res, err := c.deliver(ctx, msg)
	if err != nil {
		t.Fatalf("testkit: deliver to %s: %v", c.Name(), err)
		return Result{}
	}
	return res
}

// DeliverConcurrently delivers env n times at once, as a broker does when
// it redelivers a message whose ack was slow, or a producer that published
// it several times: the results come in no particular order. Exactly one
// of them is Processed when the handler succeeds; the others are
// Duplicate, however large n is: copies beyond the delivery limit are
// recognised as duplicates of an event that took effect.
func (c *Chain) DeliverConcurrently(ctx context.Context, t testing.TB, env framework.Envelope, n int) Results {
	t.Helper()
	if n < 1 {
		t.Fatalf("testkit: DeliverConcurrently needs n >= 1, got %d", n)
		return nil
	}
	body, err := framework.Encode(env)
	if err != nil {
		t.Fatalf("testkit: encode %s: %v", env.Key(), err)
		return nil
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), body)
		msgs[i].Metadata.Set(framework.MetadataContentType, framework.ContentType)
	}
	return c.deliverAll(ctx, t, msgs)
}

// DeliverTogether delivers each of envs at once, as a transport hands a
// consumer the messages it has in flight: under group commit their
// attempts may share a transaction (see Config.BatchLinger to make sure
// they do). The results are in the order of envs.
func (c *Chain) DeliverTogether(ctx context.Context, t testing.TB, envs ...framework.Envelope) Results {
	t.Helper()
	msgs := make([]*message.Message, len(envs))
	for i, env := range envs {
		msg, err := framework.NewMessage(env)
		if err != nil {
			t.Fatalf("testkit: encode %s: %v", env.Key(), err)
			return nil
		}
		msgs[i] = msg
	}
	return c.deliverAll(ctx, t, msgs)
}

// deliverAll delivers msgs at once and returns their results in order.
func (c *Chain) deliverAll(ctx context.Context, t testing.TB, msgs []*message.Message) Results {
	t.Helper()
	results := make(Results, len(msgs))
	errs := make([]error, len(msgs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, msg := range msgs {
		wg.Go(func() {
			<-start
			results[i], errs[i] = c.deliver(ctx, msg)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testkit: deliver to %s: %v", c.Name(), err)
		return nil
	}
	return results
}

// Replay does what an operator's replay does (effectively dead-letters
// replay) and then what the service's replay relay does: it marks the
// dead letter replayed, which records its replay, delivers its original
// message again, without the redelivered flag, and records the replay
// sent. Replay a dead letter once
// the handler or the data is fixed.
func (c *Chain) Replay(ctx context.Context, t testing.TB, dl driver.DeadLetter) Result {
	t.Helper()
	if dl.Consumer != c.Name() {
		t.Fatalf("testkit: dead letter %d belongs to consumer %s, not %s", dl.ID, dl.Consumer, c.Name())
		return Result{}
	}
	_, err := c.kit.store.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{
		Status: driver.DeadLetterReplayed,
		By:     "testkit",
		Reason: "replayed by " + t.Name(),
		At:     time.Now().UTC(),
	})
	if err != nil {
		t.Fatalf("testkit: mark dead letter %d replayed: %v", dl.ID, err)
		return Result{}
	}
	if err := c.kit.replaySent(ctx, dl.ID); err != nil {
		t.Fatalf("testkit: dead letter %d: %v", dl.ID, err)
		return Result{}
	}
	return c.DeliverMessage(ctx, t, dl.ReplayMessage())
}

// DeadLetters returns the consumer's dead letters, whatever their status,
// oldest first.
func (c *Chain) DeadLetters(ctx context.Context, t testing.TB) []driver.DeadLetter {
	t.Helper()
	return c.kit.deadLetters(ctx, t, driver.DeadLetterFilter{Consumer: c.Name()})
}

// chain builds the consumer's chain and its sweep, once: deliveries share
// it, as those of a running service do (the delivery guard knows the
// copies in flight).
func (c *Chain) chain() (message.NoPublishHandlerFunc, func(context.Context), error) {
	cfg := c.kit.cfg
	h, sweep, err := middleware.Handler(middleware.Config{
		Consumer:   c.consumer,
		UnitOfWork: c.kit.uow,
		Store:      c.kit.store,
		Settings:   cfg.Settings,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("chain of %s: %w", c.Name(), err)
	}
	return h, sweep, nil
}

// deliver runs msg through the chain and reads back what the chain itself
// reported of it (middleware.ReportOf): the outcome is the chain's own
// verdict, not a second guess.
func (c *Chain) deliver(ctx context.Context, msg *message.Message) (Result, error) {
	msg.SetContext(ctx)
	herr := c.handler(msg)
	if at, ok := crash.PointOf(herr); ok {
		return Result{Outcome: Crashed, CrashedAt: at, Err: herr}, nil
	}
	rep, ok := middleware.ReportOf(msg)
	if !ok {
		return Result{}, fmt.Errorf("the chain reported no outcome of message %s", msg.UUID)
	}
	return Result{Outcome: rep.Outcome, Code: rep.Code, Attempts: rep.Attempts, Err: herr}, nil
}

// replaySent records the replay of the dead letter id sent, as the
// service's relay does once it published it; the kit publishes it itself.
func (k *Kit) replaySent(ctx context.Context, id int64) error {
	// A lease of a nanosecond: the other replays claimed here are due
	// again at once.
	rs, err := k.store.ClaimReplays(ctx, 1000, time.Nanosecond)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.DeadLetterID != id {
			continue
		}
		if err := k.store.ReplaySent(ctx, r.ID); err != nil {
			return err
		}
	}
	return nil
}
