package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
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
	place      subscribers.Place // in a place of MaxInFlight, or held out of it (Subscriber.Hold)
}

// deliveryKey keys the context value that makes a message's context
// tell its delivery (see deliveryOf).
type deliveryKey struct{}

// deliveryOf returns the delivery of msg, a message of s; false when msg
// is none of its.
func (s *Subscriber) deliveryOf(msg *message.Message) (*pubsubDelivery, bool) {
	d, ok := msg.Context().Value(deliveryKey{}).(*pubsubDelivery)
	if !ok || d.sub.s != s {
		return nil, false
	}
	return d, true
}

// TxAck returns the ack of msg, a message of s, inside a transaction of
// s's database (see driver.TxAcker): when the unit of work's database
// is s's, the lease's deletion commits with the effect, and the router's
// Ack has nothing left to write. False when msg is not a message of s.
func (s *Subscriber) TxAck(msg *message.Message) (driver.TxAck, bool) {
	d, ok := s.deliveryOf(msg)
	if !ok {
		return driver.TxAck{}, false
	}
	return driver.TxAck{DB: s.db.DB, Batch: d.sub, Item: d}, true
}

// Hold frees the place of msg, a message of s handed out and not
// settled, for another message, while its subscription holds fewer than
// driver.SubscribeConfig.Hold so (see driver.Holder); its settling then
// frees none. Its lease is renewed as the others'.
func (s *Subscriber) Hold(msg *message.Message) bool {
	d, ok := s.deliveryOf(msg)
	return ok && d.sub.holds.Hold(&d.place)
}

// Settle hands the outcome of msg, a message of s, to its subscription
// (see driver.Settler), for a reader that settles its messages itself
// (driver.SubscribeConfig.Settles). It ignores a message not of s.
func (s *Subscriber) Settle(msg *message.Message, acked bool) {
	if d, ok := s.deliveryOf(msg); ok {
		d.Settled(acked)
	}
}

// AckInTx acknowledges the messages of items, deliveries of this
// subscription, inside tx, the transaction of their attempts (a batch's,
// under group commit), in one statement (driver.TxAckBatch): the lease
// deletions commit with the effects. The unit of work calls it just
// before commit; if the commit fails the deletions roll back with it and
// the router's Nack releases the leases. It reads only what never changes
// in sub.
func (sub *pubsubSubscription) AckInTx(ctx context.Context, tx *driver.Tx, items []any) error {
	q := sub.s.q
	if len(items) == 1 {
		d, err := sub.own(items[0])
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, q.ackOne, sub.topic, sub.s.cfg.ConsumerGroup, d.offset); err != nil {
			return fmt.Errorf("ack message %d of %s: %w", d.offset, sub.topic, err)
		}
		d.ackedInTx.Store(true)
		return nil
	}
	ds := make([]*pubsubDelivery, len(items))
	offsets := make([]int64, len(items))
	for i, item := range items {
		d, err := sub.own(item)
		if err != nil {
			return err
		}
		ds[i], offsets[i] = d, d.offset
	}
	if _, err := tx.ExecContext(ctx, q.ack, sub.topic, sub.s.cfg.ConsumerGroup, sqlstore.JSONIDs(offsets)); err != nil {
		return fmt.Errorf("ack %d messages of %s: %w", len(offsets), sub.topic, err)
	}
	for _, d := range ds {
		d.ackedInTx.Store(true)
	}
	return nil
}

// own returns item as a delivery of sub.
func (sub *pubsubSubscription) own(item any) (*pubsubDelivery, error) {
	d, ok := item.(*pubsubDelivery)
	if !ok || d.sub != sub {
		return nil, fmt.Errorf("ack messages of %s: %T is not a message of this subscription", sub.topic, item)
	}
	return d, nil
}

// Settled cancels the message's context and hands its outcome to the run
// loop. After the subscription ended it drops it: the
// shutdown read the message's state itself.
func (d *pubsubDelivery) Settled(acked bool) {
	d.cancel()
	select {
	case d.sub.results <- pubsubResult{d: d, acked: acked}:
	case <-d.sub.ctx.Done():
	}
}

// maxMillis is the last millisecond of the year 9999, in Unix
// milliseconds.
const maxMillis = 253402300799999

func (sub *pubsubSubscription) newDelivery(r claimedRow) *pubsubDelivery {
	// Metadata that is not a JSON object of strings (a row inserted by
	// hand) marks the message unreadable, to be dead-lettered.
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata)
	msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(r.deliveries > 1))
	// 0: a row inserted by hand with no time, or none readable; past the
	// year 9999, no time RFC 3339 can write.
	if r.createdAt > 0 && r.createdAt <= maxMillis {
		msg.Metadata.Set(framework.MetadataPublishedAt, time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339Nano))
	}
	d := &pubsubDelivery{sub: sub, offset: r.offset, deliveries: r.deliveries, msg: msg}
	ctx, cancel := context.WithCancel(sub.ctx)
	d.cancel = cancel
	msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
	return d
}
