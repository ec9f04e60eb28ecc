package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
)

// The replay relay's pace.
const (
	// replayIdle is how long the relay waits, when it found no replay to
	// publish, before it looks again: a replay recorded by an operator's
	// command, in another process, is published within about that long.
	replayIdle = 200 * time.Millisecond
	// replayRetry is how long the relay waits after a failure (the
	// database or the transport is down) before it tries again.
	replayRetry = 5 * time.Second
	// replayBatch is how many replays the relay claims at once.
	replayBatch = 100
	// replayLease is how long a claim keeps the other relays off the
	// replays it took: those of a relay whose process died are published
	// by the next relay once it ends, so at least this long after the
	// death.
	replayLease = 10 * time.Second
	// replaySentTimeout bounds the record of a publication, which the
	// relay makes even when the service is stopping: a publication not
	// recorded is published again.
	replaySentTimeout = 5 * time.Second
)

// replayPublisher is what the replay relay needs of the transport: its
// replay path (driver.Transport's Replay), which hands a message to
// one consumer alone.
type replayPublisher interface {
	Replay(ctx context.Context, consumer string, msgs ...*message.Message) error
}

// replayRelay publishes the replays that operators record in the database
// (a replayed dead letter, an event released from parking: see
// driver.Store's ResolveDeadLetter and AddReplays) through the
// transport's replay path, each to its consumer alone, and records each
// one sent once published. The Runner runs it from Start to Stop, and it
// looks for new replays every replayIdle.
//
// A replay is published at least once: one published by a relay whose
// process died before it recorded the publication is published again
// after the claim's lease (replayLease), and the consumer's processed mark
// absorbs the copy. The replays of one consumer are published in the
// order they were recorded: when one fails, the consumer's later replays
// of the batch wait with it for the lease to end. One that the transport
// refuses for good (a permanent error) is dead-lettered again with its
// code instead (see refuse), and the later ones go on.
type replayRelay struct {
	store     driver.Store
	transport replayPublisher
	logger    *slog.Logger
	// lease is the claims' lease; zero means replayLease (tests shorten
	// it). A publication may take a third of it.
	lease time.Duration
}

// leaseOf returns the relay's lease.
func (r *replayRelay) leaseOf() time.Duration {
	if r.lease > 0 {
		return r.lease
	}
	return replayLease
}

// newReplayRelay returns the replay relay of store, publishing through
// transport.
func newReplayRelay(store driver.Store, transport replayPublisher, logger *slog.Logger) *replayRelay {
	return &replayRelay{store: store, transport: transport, logger: logger.With("component", "replay relay")}
}

// run publishes the recorded replays until ctx ends. A crash hook on ctx
// (crash.With) is called at the relay's crash points.
func (r *replayRelay) run(ctx context.Context) {
	for {
		n, err := r.relay(ctx)
		wait := replayIdle
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait = replayRetry
			r.logger.ErrorContext(ctx, "replays not published; trying again", "error", err, "published", n, "retry_in", wait)
		case n > 0:
			r.logger.InfoContext(ctx, "replays published", "published", n)
		}
		if n == replayBatch && err == nil {
			continue // more may wait
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// relay claims a batch of replays, publishes them and records them sent;
// it returns how many it published. A replay it fails to publish stays
// claimed until its lease ends, with the later replays of its consumer.
// It publishes no replay once less of the lease is left than a
// publication may take: another relay may claim it as the lease ends, and
// publish it too. The rest are claimed again once their lease ended.
func (r *replayRelay) relay(ctx context.Context) (int, error) {
	lease := r.leaseOf()
	last := time.Now().Add(lease - lease/3) // the lease began after now
	rs, err := r.store.ClaimReplays(ctx, replayBatch, lease)
	if err != nil {
		return 0, fmt.Errorf("claim replays: %w", err)
	}
	var (
		published int
		failed    map[string]bool
		errs      []error
	)
	for _, rp := range rs {
		if failed[rp.Consumer] {
			continue // its order: it waits for the lease with the one that failed
		}
		if time.Now().After(last) {
			break // the rest wait for their lease to end
		}
		err := r.publish(ctx, rp)
		var died *crash.Died
		switch {
		case errors.As(err, &died):
			return published, err // as if the process died: the claims stay until their lease ends
		case err == nil:
			published++
		case framework.IsPermanent(err):
			// Never publishable: waiting would hold the consumer's later
			// replays for ever.
			err = r.refuse(ctx, rp, err)
		}
		if err != nil {
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[rp.Consumer] = true
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return published, errors.Join(errs...)
}

// publish publishes rp to its consumer alone and records it sent.
func (r *replayRelay) publish(ctx context.Context, rp driver.Replay) error {
	if r.dies(ctx, crash.BeforeReplayPublish) {
		return &crash.Died{At: crash.BeforeReplayPublish}
	}
	pubCtx, cancel := context.WithTimeout(ctx, r.leaseOf()/3)
	err := r.transport.Replay(pubCtx, rp.Consumer, replayMessage(rp))
	cancel()
	if err != nil {
		return fmt.Errorf("replay %d to %s: %w", rp.ID, rp.Consumer, err)
	}
	if r.dies(ctx, crash.BeforeReplaySent) {
		return &crash.Died{At: crash.BeforeReplaySent}
	}
	// Recorded even when the service is stopping: otherwise it would be
	// published again.
	sentCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replaySentTimeout)
	defer cancel()
	if err := r.store.ReplaySent(sentCtx, rp.ID); err != nil {
		return fmt.Errorf("replay %d to %s published, not recorded sent (it is published again; the consumer absorbs the copy): %w", rp.ID, rp.Consumer, err)
	}
	return nil
}

// refuse ends rp, which the transport refused for good (a permanent
// error: on RabbitMQ, headers that do not fit in a frame), as a failure of
// its message: the replayed dead letter is pending again, with the
// error's code and the failure in its history, and an event released from
// parking becomes a dead letter of its own; then rp is recorded sent, so
// that the consumer's later replays go on. A crash between the two
// publishes rp again after its lease, which the transport refuses again:
// the dead letter counts one more repeat.
func (r *replayRelay) refuse(ctx context.Context, rp driver.Replay, cause error) error {
	dl, err := r.deadLetterOf(ctx, rp)
	if err != nil {
		return fmt.Errorf("replay %d to %s refused by the transport (%w), not dead-lettered: %w", rp.ID, rp.Consumer, cause, err)
	}
	now := time.Now().UTC()
	dl.Code = framework.CodeOf(cause)
	dl.Attempts, dl.Deliveries = 0, 0
	dl.LastFailedAt = now
	if dl.FirstFailedAt.IsZero() {
		dl.FirstFailedAt = now
	}
	dl.Status = driver.DeadLetterPending
	if err := r.store.PublishDeadLetter(ctx, dl); err != nil {
		return fmt.Errorf("replay %d to %s refused by the transport (%w), not dead-lettered: %w", rp.ID, rp.Consumer, cause, err)
	}
	sentCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replaySentTimeout)
	defer cancel()
	if err := r.store.ReplaySent(sentCtx, rp.ID); err != nil {
		return fmt.Errorf("replay %d to %s dead-lettered (%s), not recorded done: %w", rp.ID, rp.Consumer, dl.Code, err)
	}
	r.logger.WarnContext(ctx, "replay refused by the transport; dead-lettered again",
		"replay", rp.ID, "consumer", rp.Consumer, "dead_letter", rp.DeadLetterID, "code", dl.Code, "error", cause)
	return nil
}

// deadLetterOf returns the dead letter that rp replays, or, for an event
// released from parking (or a dead letter purged since), a new one of its
// consumer built from its message: the event's key and attributes when
// its body decodes, else framework.BodyKey's key.
func (r *replayRelay) deadLetterOf(ctx context.Context, rp driver.Replay) (driver.DeadLetter, error) {
	if rp.DeadLetterID != 0 {
		dl, err := r.store.DeadLetter(ctx, rp.DeadLetterID)
		if !errors.Is(err, driver.ErrNotFound) {
			return dl, err
		}
	}
	dl := driver.DeadLetter{
		Consumer: rp.Consumer,
		Topic:    rp.Topic,
		Body:     rp.Body,
		Metadata: driver.StorableMetadata(rp.Metadata),
	}
	if env, err := framework.Decode(rp.Body, max(len(rp.Body), 1)); err == nil && env.Key().Validate() == nil {
		dl.Source, dl.EventID = env.Source, env.ID
		dl.Type, dl.Version = env.Type, env.Version
		dl.Subject, dl.SubjectSeq, dl.CorrelationID = env.Subject, env.SubjectSeq, env.CorrelationID
	} else {
		key := framework.BodyKey(rp.Body)
		dl.Source, dl.EventID = key.Source, key.ID
	}
	return dl, nil
}

// dies calls the crash hook of ctx, if any, at point at.
func (r *replayRelay) dies(ctx context.Context, at crash.Point) bool {
	h := crash.HookOf(ctx)
	return h != nil && h(ctx, at)
}

// replayMessage returns the message of rp: its body and metadata under a
// new UUID, without a redelivery marker (it is a first delivery), and,
// for a replayed dead letter, with framework.MetadataReplayOf naming it.
func replayMessage(rp driver.Replay) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), rp.Body)
	for k, v := range rp.Metadata {
		if k != framework.MetadataRedelivered {
			msg.Metadata.Set(k, v)
		}
	}
	if rp.DeadLetterID != 0 && msg.Metadata.Get(framework.MetadataReplayOf) == "" {
		msg.Metadata.Set(framework.MetadataReplayOf, strconv.FormatInt(rp.DeadLetterID, 10))
	}
	return msg
}
