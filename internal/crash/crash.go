// Package crash is the one seam through which tests make a consumer's
// delivery, or the service's replay relay, die at a named step, as if its
// process died there: the test kit's crash injection (app/testkit) and the
// crash tests that kill a real service process both hook into it.
//
// A Hook travels on the message's context (With), never in a global: the
// chain and the unit of work look it up once per delivery and attempt,
// and call it at each Point the delivery passes. With no hook installed
// each point costs one nil check.
//
// A hook that kills its process (os.Exit, SIGKILL) never returns. A hook
// that returns true makes the delivery die in-process: the steps stop
// right there, an open transaction is rolled back without running its
// hooks, nothing is acknowledged, and the chain returns a *Died error, a
// pipeline.ErrLater: the message is neither retried nor dead-lettered,
// and the transport delivers it again later. Under group commit a death
// inside a batch kills every attempt of the batch, as a process death
// would.
package crash

import (
	"context"
	"errors"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// Point names a step of the pipeline where a delivery can die.
type Point string

// The points, in the order a delivery passes them.
const (
	// AfterDecode: the message decoded and routed; nothing written yet.
	AfterDecode Point = "after_decode"
	// AfterCount: the delivery guard wrote the delivery's count (in a
	// transaction of its own), before the attempts. Only deliveries the
	// guard counts pass it: every delivery on a transport that cannot
	// tell a redelivery, the redeliveries on the others.
	AfterCount Point = "after_count"
	// AfterMark: inside the attempt's transaction, the processed mark
	// written, the handler not run yet. A duplicate does not pass it.
	AfterMark Point = "after_mark"
	// BeforeCommit: inside the attempt's transaction, the handler
	// returned nil; nothing committed yet.
	BeforeCommit Point = "before_commit"
	// AfterCommit: the attempt's effect committed (with its batch under
	// group commit); the transaction's OnCommit hooks have not run and
	// the message is not acknowledged.
	AfterCommit Point = "after_commit"
	// BeforeDeadLetter: the message is to be dead-lettered, the dead
	// letter not stored yet, nor, under strict order, the hold of its
	// subject, which is stored with it.
	BeforeDeadLetter Point = "before_dead_letter"
	// BeforeAck: the chain is done with the message (its effect
	// committed, or it was a duplicate, stale or stored as a dead letter)
	// and it is about to be acknowledged.
	BeforeAck Point = "before_ack"
)

// The points of the service's replay relay, which publishes the replays
// that operators record (a replayed dead letter, a released parked event):
// no delivery passes them, so Points leaves them out. The relay's hook
// travels on the relay's context.
const (
	// BeforeReplayPublish: the relay claimed a replay; nothing published.
	BeforeReplayPublish Point = "before_replay_publish"
	// BeforeReplaySent: the relay published a replay and has not recorded
	// it sent: a relay after it publishes it again.
	BeforeReplaySent Point = "before_replay_sent"
)

// The point of the outbox relay (framework/outbox), which publishes the
// events that handlers and services added to their outbox. No delivery
// passes it, so Points leaves it out; the relay's hook travels on the
// context of its Run.
const (
	// BeforeOutboxSent: the relay published a batch's rows (the broker
	// confirmed them) and has not marked them sent: a relay after it
	// publishes them again.
	BeforeOutboxSent Point = "before_outbox_sent"
)

// The point of the deliveries of a partitioned consumer (one of
// several partitions, see driver.Fencer), which alone check their
// partition's lease before the commit: the others never pass it, so
// Points leaves it out.
const (
	// AfterFence: inside the attempt's transaction (its batch's under
	// group commit), after BeforeCommit, the lease of the message's
	// partition checked and found the process's (on PostgreSQL the
	// lease row is locked until the transaction ends: see
	// driver.Leases.Fence); nothing committed yet.
	AfterFence Point = "after_fence"
)

// Points returns every point, in the order a delivery passes them.
func Points() []Point {
	return []Point{AfterDecode, AfterCount, AfterMark, BeforeCommit, AfterCommit, BeforeDeadLetter, BeforeAck}
}

// Hook is called at each point a delivery passes, with the context of
// that step: from AfterDecode on it carries the decoded event
// (framework.EnvelopeFromContext), at AfterMark and BeforeCommit the
// attempt's transaction (driver.TxFromContext). It reports whether the
// delivery dies there. Under group commit it runs on the goroutine of the
// batch, possibly an attempt's other than its own: it must not block
// unless it means to hold the batch.
type Hook func(ctx context.Context, at Point) bool

// Relays carries the crash hook of a service's relays, the outbox relay
// and the replay relay, which call it at their points (BeforeOutboxSent,
// BeforeReplayPublish, BeforeReplaySent). A crash test supplies it to the
// service's fx application, fx.Supply(crash.Relays{Hook: h}), which puts
// Hook on the context of each relay's run; without it the relays have no
// hook. A delivery's hook travels on the message's context instead (With).
type Relays struct {
	// Hook is the hook; nil is none.
	Hook Hook
}

// With returns ctx carrying h: the deliveries and attempts that run in
// ctx call h at each point.
func With(ctx context.Context, h Hook) context.Context { return pipeline.With(ctx, h) }

// HookOf returns the hook ctx carries, nil when none.
func HookOf(ctx context.Context) Hook {
	h, _ := pipeline.From[Hook](ctx)
	return h
}

// Died is the error of a delivery that died at a point: the chain
// returns it, so the transport is not told to acknowledge the message.
// It is a pipeline.ErrLater (errors.Is), so that no step retries or
// dead-letters it.
type Died struct {
	// At is the point where the delivery died, or, for the batch-mates
	// of an attempt that died, where that attempt died.
	At Point
}

// Error says where the delivery died.
func (d *Died) Error() string {
	return "the delivery died at " + string(d.At) + " (crash injected)"
}

// Is reports whether target is pipeline.ErrLater: a delivery that died
// is delivered again later, as after a process's death.
func (d *Died) Is(target error) bool { return target == pipeline.ErrLater }

// PointOf returns where the delivery whose chain returned err died;
// false when it did not die.
func PointOf(err error) (Point, bool) {
	var d *Died
	if errors.As(err, &d) {
		return d.At, true
	}
	return "", false
}
