package middleware

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
)

var errNotDecoded = errors.New("message was not decoded: add the decode step outside this step")

// unitOfWork runs each attempt inside uow (see
// driver.UnitOfWork.DoDelivery): one transaction that holds the
// processed mark of (consumer, event) and the handler's writes, which
// forgets the delivery's count when the delivery guard counted it and,
// with acker, acknowledges the message. A duplicate is skipped and
// acknowledged. The message context inside carries the transaction; it is
// restored after. With strict (StrictOrder), an event's subject goes to
// the unit of work (driver.Delivery.OrderedSubject), whose batches then
// read and move the checkpoints of their attempts together.
func unitOfWork(consumer string, uow *driver.UnitOfWork, acker driver.TxAcker, fencer driver.Fencer, strict bool) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			d, err := eventOf(msg.Context())
			if err != nil {
				return nil, err
			}
			orig := msg.Context()
			defer msg.SetContext(orig)
			dl := delivery(st, acker, fencer, msg)
			if strict && d.SubjectSeq != 0 {
				dl.OrderedSubject, dl.OrderedSeq = d.Subject, d.SubjectSeq
			}
			outcome, err := uow.DoDelivery(orig, consumer, d.Key(), dl, func(ctx context.Context) error {
				msg.SetContext(ctx)
				_, err := next(msg)
				return err
			})
			st.outcome = outcome
			return nil, err
		}
	}
}

// delivery is what the unit of work needs to know of msg's delivery: its
// count by the delivery guard (st), its ack inside the transaction when
// acker has one, and its partition's fence when fencer is set and msg
// came from a partition.
func delivery(st *state, acker driver.TxAcker, fencer driver.Fencer, msg *message.Message) driver.Delivery {
	d := driver.Delivery{Counted: st.counted}
	if acker != nil {
		d.Ack, _ = acker.TxAck(msg)
	}
	if fencer != nil {
		if p, ok := driver.PartitionFromContext(msg.Context()); ok {
			d.Fencer, d.Partition = fencer, p
		}
	}
	return d
}
