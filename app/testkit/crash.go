package testkit

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
)

// CrashPoint names a step of the consumer pipeline where a delivery can
// die as if its process died there (see DeliverCrashing).
type CrashPoint = crash.Point

// The crash points, in the order a delivery passes them.
const (
	// AfterDecode: the message decoded; nothing written yet.
	AfterDecode CrashPoint = crash.AfterDecode
	// AfterCount: the delivery guard counted the delivery (in a
	// transaction of its own), before the attempts. The kit counts every
	// delivery, as on a transport that cannot tell a redelivery.
	AfterCount CrashPoint = crash.AfterCount
	// AfterMark: in the attempt's transaction, the processed mark written,
	// the handler not run yet. A duplicate never gets there.
	AfterMark CrashPoint = crash.AfterMark
	// BeforeCommit: in the attempt's transaction, the handler returned
	// nil, its writes are not committed.
	BeforeCommit CrashPoint = crash.BeforeCommit
	// AfterCommit: the effect committed, with the attempt's batch under
	// group commit; its OnCommit hooks did not run and the message is not
	// acknowledged.
	AfterCommit CrashPoint = crash.AfterCommit
	// BeforeDeadLetter: the message is to be dead-lettered, the dead
	// letter is not stored yet.
	BeforeDeadLetter CrashPoint = crash.BeforeDeadLetter
	// BeforeAck: the chain is done with the message (processed,
	// duplicate, stale or dead-lettered), the ack is not sent.
	BeforeAck CrashPoint = crash.BeforeAck
)

// CrashPoints returns every crash point, in the order a delivery passes
// them.
func CrashPoints() []CrashPoint { return crash.Points() }

// Crashed is the Outcome of a delivery that died at a crash point: the
// transport never heard of it again, and delivers the message again
// (Redeliver).
const Crashed framework.Outcome = "crashed"

// CrashHook decides, at each crash point a delivery passes, whether the
// delivery dies there. Its context carries, from AfterDecode on, the
// decoded event (framework.EnvelopeFromContext) and, at AfterMark and
// BeforeCommit, the attempt's transaction (driver.TxFromContext). Under
// group commit it may run on the goroutine of another delivery of its
// batch.
type CrashHook = crash.Hook

// WithCrashHook returns ctx carrying h: the deliveries made with it call
// h at each crash point they pass. When h returns true the delivery dies
// there, as if its process died: an open transaction rolls back without
// running its hooks, nothing is acknowledged, nothing is retried or
// dead-lettered, and the Result is Crashed. Under group commit the
// deliveries that share its batch die with it.
func WithCrashHook(ctx context.Context, h CrashHook) context.Context { return crash.With(ctx, h) }

// CrashAt returns ctx carrying a hook that makes the deliveries made with
// it die at point at (see WithCrashHook).
func CrashAt(ctx context.Context, at CrashPoint) context.Context {
	return crash.With(ctx, func(_ context.Context, p crash.Point) bool { return p == at })
}

// CrashOnce returns a hook that makes the first delivery to pass point at
// die there, and no delivery after it: the redelivery of the message
// lives. Give each test a hook of its own.
func CrashOnce(at CrashPoint) CrashHook {
	var fired atomic.Bool
	return func(_ context.Context, p crash.Point) bool {
		return p == at && fired.CompareAndSwap(false, true)
	}
}

// DeliverCrashing delivers env as Deliver does, and makes the delivery
// die at point at, as if its process died there (see WithCrashHook): the
// Result is Crashed, with CrashedAt set to at. It fails the test when the
// delivery ends without passing at: a duplicate never passes AfterMark
// or BeforeCommit, a delivery that is not dead-lettered never passes
// BeforeDeadLetter.
//
// A crash before the effect committed leaves nothing behind: the
// redelivery is processed. From AfterCommit on the effect is committed
// and only the ack is lost: the redelivery is a duplicate.
func (c *Chain) DeliverCrashing(ctx context.Context, t testing.TB, env framework.Envelope, at CrashPoint) Result {
	t.Helper()
	res := c.Deliver(CrashAt(ctx, at), t, env)
	if res.Outcome != Crashed {
		t.Fatalf("testkit: the delivery of %s never reached crash point %s: %s", env.Key(), at, res)
		return res
	}
	return res
}

// Redeliver delivers env again as a transport delivers a message that
// was not acknowledged (its process died, its lease expired): marked as
// a redelivery (framework.MetadataRedelivered), which the delivery guard
// counts.
func (c *Chain) Redeliver(ctx context.Context, t testing.TB, env framework.Envelope) Result {
	t.Helper()
	msg, err := framework.NewMessage(env)
	if err != nil {
		t.Fatalf("testkit: encode %s: %v", env.Key(), err)
		return Result{}
	}
	return c.DeliverMessage(ctx, t, redelivery(msg))
}

// redelivery marks msg as delivered before.
func redelivery(msg *message.Message) *message.Message {
	msg.Metadata.Set(framework.MetadataRedelivered, "true")
	return msg
}

// RequireCrashed fails the test unless the delivery died at crash point
// at.
func RequireCrashed(t testing.TB, res Result, at CrashPoint) {
	t.Helper()
	if res.Outcome != Crashed || res.CrashedAt != at {
		t.Fatalf("testkit: want the delivery crashed at %s, got %s", at, res)
	}
}
