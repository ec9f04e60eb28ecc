package sqlite

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

type pubsubResult struct {
	d     *pubsubDelivery
	acked bool
}

// pubsubSubscription is the state of one Subscribe call, owned by its run
// goroutine.
type pubsubSubscription struct {
	s          *Subscriber
	topic      string
	ctx        context.Context
	cancel     context.CancelFunc
	out        chan *message.Message
	results    chan pubsubResult
	wake       <-chan struct{}
	stopListen func()
	log        *slog.Logger

	pending   []*pubsubDelivery            // claimed, not yet handed out
	sent      map[*pubsubDelivery]struct{} // handed out, not yet acked or nacked
	holds     *subscribers.Holds           // the deliveries of sent held out of MaxInFlight (Subscriber.Hold)
	acks      []int64
	nacks     []int64
	wantClaim bool
	// reported says that the reader reports each message's outcome
	// (Subscriber.Settle): no goroutine watches a message then.
	reported bool
	msgWG    sync.WaitGroup // the goroutines watching messages
}

func (sub *pubsubSubscription) run() {
	defer sub.s.wg.Done()
	defer close(sub.out)
	defer sub.stopListen()
	cfg := sub.s.cfg

	poll := time.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	flush := time.NewTimer(cfg.AckFlushInterval)
	flush.Stop()
	flushArmed, flushFired := false, false
	retry := time.NewTimer(cfg.RetryInterval)
	retry.Stop()
	retrying := false
	nackWake := time.NewTimer(cfg.NackDelay)
	nackWake.Stop()
	renew := time.NewTicker(renewInterval(cfg.LeaseDuration))
	defer renew.Stop()

	// A sync (the write of the buffered acks and nacks and a claim) runs
	// on a goroutine of its own, one at a time, while this loop goes on
	// handing out the messages claimed ahead and taking the results: the
	// sync waits for the file's write lock behind the batches of the
	// messages in flight, and they must not run dry meanwhile. The
	// goroutine outlives the syncs: a sync runs down the SQLite driver's
	// deep stack, which a goroutine started for each sync would grow
	// again from its smallest, a copy at each doubling.
	syncs := make(chan syncDone, 1)
	syncWork := make(chan func() syncDone, 1)
	syncExited := make(chan struct{})
	go func() {
		defer close(syncExited)
		for sync := range syncWork {
			syncs <- sync()
		}
	}()
	defer func() {
		close(syncWork) // no sync runs: the loop waits for one before it returns
		<-syncExited
	}()
	syncing := false
	wakes := 0 // counts the wakes, so that a sync's "nothing due" does not drop a later one
	renewDue := false
	for {
		if sub.ctx.Err() != nil {
			if syncing {
				_ = sub.syncEnded(<-syncs, wakes) // shutdown writes what is left
			}
			sub.shutdown()
			return
		}
		if !retrying && !syncing {
			claimN := sub.claimWanted()
			buffered := len(sub.acks) + len(sub.nacks)
			idle := len(sub.pending) == 0 && len(sub.sent) == 0
			flushNow := buffered > 0 && (buffered >= cfg.ClaimBatchSize || idle || flushFired)
			if flushNow || claimN > 0 {
				acks, nacks, at := sub.acks, sub.nacks, wakes
				sub.acks, sub.nacks = nil, nil
				if flushArmed {
					flush.Stop()
					flushArmed = false
				}
				syncing = true
				syncWork <- func() syncDone { return sub.sync(acks, nacks, claimN, at) }
			}
			flushFired = false // a fire is spent by the sync it started, or with nothing buffered
		}

		var out chan<- *message.Message
		var next *message.Message
		if len(sub.pending) > 0 && len(sub.sent)-sub.holds.Held() < cfg.MaxInFlight {
			out, next = sub.out, sub.pending[0].msg
		}
		select {
		case <-sub.ctx.Done():
		case r := <-syncs:
			syncing = false
			if err := sub.syncEnded(r, wakes); err != nil {
				if sub.ctx.Err() != nil {
					continue // shutdown writes what is left
				}
				sub.log.Warn("sqlite pubsub: claim or ack failed, retrying",
					slog.Any("error", err), slog.Duration("retry_in", cfg.RetryInterval))
				retrying = true
				retry.Reset(cfg.RetryInterval)
				flushFired = len(sub.acks)+len(sub.nacks) > 0 // written once the retry is due
			} else if len(r.nacks) > 0 {
				nackWake.Reset(cfg.NackDelay)
			}
			if renewDue {
				renewDue = false
				sub.renew()
			}
		case out <- next:
			d := sub.pending[0]
			sub.pending[0] = nil
			sub.pending = sub.pending[1:]
			sub.sent[d] = struct{}{}
			if !sub.reported {
				sub.msgWG.Go(func() { subscribers.Watch(sub.ctx, d.msg, d) })
			}
		case r := <-sub.results:
			delete(sub.sent, r.d)
			sub.holds.Settle(&r.d.place)
			switch {
			case !r.acked:
				sub.nacks = append(sub.nacks, r.d.offset)
			case !r.d.ackedInTx.Load():
				sub.acks = append(sub.acks, r.d.offset)
			}
			if !flushArmed && len(sub.acks)+len(sub.nacks) > 0 {
				flush.Reset(cfg.AckFlushInterval)
				flushArmed = true
			}
		case <-flush.C:
			flushArmed, flushFired = false, true
		case <-retry.C:
			retrying = false
		case <-sub.wake:
			sub.wantClaim = true
			wakes++
		case <-sub.holds.Wake():
			sub.wantClaim = true
		case <-poll.C:
			sub.wantClaim = true
			wakes++
		case <-nackWake.C:
			sub.wantClaim = true
			wakes++
		case <-renew.C:
			if syncing {
				renewDue = true // after the sync: one connection at a time
				continue
			}
			sub.renew()
		}
	}
}

// claimWanted returns how many messages to claim now: a batch once at
// least half a batch of slots is free (or nothing is held), so that claims
// and acks share transactions. The slots are MaxInFlight plus claimAhead:
// the messages claimed ahead wait, leased, for a slot of those in flight,
// so that the slots that acks free are filled at once, not after a claim
// that queues for the write lock behind the batches of the messages in
// flight (the unit of work's batches would run dry meanwhile).
func (sub *pubsubSubscription) claimWanted() int {
	cfg := sub.s.cfg
	if !sub.wantClaim {
		return 0
	}
	held := len(sub.sent) - sub.holds.Held() + len(sub.pending)
	free := cfg.MaxInFlight + claimAhead(cfg) - held
	batch := min(cfg.ClaimBatchSize, cfg.MaxInFlight)
	if free <= 0 || (free < max(1, batch/2) && held > 0) {
		return 0
	}
	return min(free, batch)
}

// claimAhead is how many messages a subscription holds claimed beyond its
// MaxInFlight, waiting to be handed out: half a claim batch, none when a
// claim takes one message.
func claimAhead(cfg SubscriberConfig) int {
	return min(cfg.ClaimBatchSize, cfg.MaxInFlight) / 2
}

// renewInterval is how often a subscription renews its leases: a third of
// the lease, so that two renewals may fail or wait before one expires.
func renewInterval(lease time.Duration) time.Duration {
	return max(lease/3, time.Millisecond)
}

// renew renews the leases held, and logs a failure: the next renewal
// tries again.
func (sub *pubsubSubscription) renew() {
	if err := sub.renewLeases(); err != nil && sub.ctx.Err() == nil {
		sub.log.Warn("sqlite pubsub: could not renew the leases of the messages in flight; retrying at the next renewal",
			slog.Any("error", err), slog.Duration("lease", sub.s.cfg.LeaseDuration))
	}
}

// renewLeases extends, in one short write transaction, the leases of the
// messages the subscription holds: handed out and not yet acked or
// nacked, or claimed and waiting to be handed out. A lease is renewed only
// while its deliveries count is the one of this subscription's claim: one
// that expired and was claimed by another subscription (or process) stays
// theirs, and one deleted by an ack stays deleted.
func (sub *pubsubSubscription) renewLeases() error {
	held := make([][2]int64, 0, len(sub.sent)+len(sub.pending))
	for d := range sub.sent {
		held = append(held, [2]int64{d.offset, d.deliveries})
	}
	for _, d := range sub.pending {
		held = append(held, [2]int64{d.offset, d.deliveries})
	}
	if len(held) == 0 {
		return nil
	}
	s := sub.s
	tx, err := s.db.BeginTxx(sub.ctx, nil)
	if err != nil {
		return fmt.Errorf("renew leases: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	until := time.Now().Add(s.cfg.LeaseDuration).UnixMilli()
	if _, err := tx.ExecContext(sub.ctx, s.q.renew, until, sub.topic, s.cfg.ConsumerGroup, pubsubClaims(held)); err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("renew leases: commit: %w", err)
	}
	return nil
}

// shutdown ends the subscription: it cancels the message contexts, writes
// the acks and nacks given so far, and releases every message still held
// so that it is delivered again at once (those never handed out without
// counting a delivery).
func (sub *pubsubSubscription) shutdown() {
	sub.cancel()
	sub.msgWG.Wait()
	var releases, unclaims []int64
	for d := range sub.sent {
		select {
		case <-d.msg.Acked():
			if !d.ackedInTx.Load() {
				sub.acks = append(sub.acks, d.offset)
			}
		case <-d.msg.Nacked():
			sub.nacks = append(sub.nacks, d.offset)
		default:
			releases = append(releases, d.offset)
		}
	}
	for _, d := range sub.pending {
		d.cancel()
		unclaims = append(unclaims, d.offset)
	}
	if len(sub.acks)+len(sub.nacks)+len(releases)+len(unclaims) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), pubsubShutdownTimeout)
	defer cancel()
	err := func() error {
		tx, err := sub.s.db.BeginTxx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer func() { _ = tx.Rollback() }() // no-op after Commit
		if err := sub.writeResults(ctx, tx, time.Now(), sub.acks, sub.nacks, releases, unclaims); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		sub.log.Warn("sqlite pubsub: could not write acks or release messages on close; unacked messages come back when their leases expire",
			slog.Any("error", err))
		return
	}
	if len(releases)+len(unclaims) > 0 {
		sub.s.cfg.Notifier.Notify(sub.topic)
	}
}
