package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// pubsubDelivery is one claimed message of a subscription.
type pubsubDelivery struct {
	sub    *pubsubSubscription
	offset int64
	// deliveries is the lease row's count at the claim. Every claim by
	// another subscription increments it, so a renewal that finds it
	// unchanged renews a lease this subscription still holds.
	deliveries int64
	msg        *message.Message
	cancel     context.CancelFunc
	ackedInTx  atomic.Bool
}

// ackInTx acknowledges the message inside the handler's transaction. The
// unit of work calls it just before commit; if the commit fails the
// deletion rolls back with it and the router's Nack releases the lease.
func (d *pubsubDelivery) ackInTx(ctx context.Context, tx pipeline.Execer) error {
	q := d.sub.s.q
	if _, err := tx.ExecContext(ctx, q.ackOne, d.sub.topic, d.sub.s.cfg.ConsumerGroup, d.offset); err != nil {
		return fmt.Errorf("ack message %d of %s: %w", d.offset, d.sub.topic, err)
	}
	d.ackedInTx.Store(true)
	return nil
}

// AckAll acknowledges the messages of acks, deliveries of this
// subscription, inside the transaction of a batch of the unit of work, in
// one statement (pipeline.AckBatch): the batch's lease deletions commit
// with its effects. It reads only what never changes in sub.
func (sub *pubsubSubscription) AckAll(ctx context.Context, tx pipeline.Execer, acks []pipeline.AckInTx) error {
	ds := make([]*pubsubDelivery, len(acks))
	offsets := make([]int64, len(acks))
	for i, a := range acks {
		d, ok := a.Item.(*pubsubDelivery)
		if !ok || d.sub != sub {
			return fmt.Errorf("ack messages of %s: %T is not a message of this subscription", sub.topic, a.Item)
		}
		ds[i], offsets[i] = d, d.offset
	}
	q := sub.s.q
	if _, err := tx.ExecContext(ctx, q.ack, sub.topic, sub.s.cfg.ConsumerGroup, pubsubOffsets(offsets)); err != nil {
		return fmt.Errorf("ack %d messages of %s: %w", len(offsets), sub.topic, err)
	}
	for _, d := range ds {
		d.ackedInTx.Store(true)
	}
	return nil
}

// Settled cancels the message's context and hands its outcome to the run
// loop (pipeline.Settler). After the subscription ended it drops it: the
// shutdown read the message's state itself.
func (d *pubsubDelivery) Settled(acked bool) {
	d.cancel()
	select {
	case d.sub.results <- pubsubResult{d: d, acked: acked}:
	case <-d.sub.ctx.Done():
	}
}

func (sub *pubsubSubscription) newDelivery(r claimedRow) *pubsubDelivery {
	// Metadata that is not a JSON object of strings (a row inserted by
	// hand) marks the message unreadable, to be dead-lettered.
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata)
	msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(r.deliveries > 1))
	d := &pubsubDelivery{sub: sub, offset: r.offset, deliveries: r.deliveries, msg: msg}
	ctx, cancel := context.WithCancel(sub.ctx)
	d.cancel = cancel
	if sub.reported {
		ctx = pipeline.With[pipeline.Settler](ctx, d)
	}
	msg.SetContext(pipeline.With(ctx, pipeline.AckInTx{DB: sub.s.db.DB, Ack: d.ackInTx, Batch: sub, Item: d}))
	return d
}
