package middleware

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/driver"
)

var errNotDecoded = errors.New("message was not decoded: add the decode step outside this step")

// unitOfWork runs each attempt inside uow (see driver.UnitOfWork.Do):
// one transaction that holds the processed mark of (consumer, event) and
// the handler's writes. A duplicate is skipped and acknowledged. The
// message context inside carries the transaction; it is restored after.
func unitOfWork(consumer string, uow *driver.UnitOfWork) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			d, err := eventOf(msg.Context())
			if err != nil {
				return nil, err
			}
			orig := msg.Context()
			defer msg.SetContext(orig)
			outcome, err := uow.Do(orig, consumer, d.Key(), func(ctx context.Context) error {
				msg.SetContext(ctx)
				_, err := next(msg)
				return err
			})
			st.outcome = outcome
			return nil, err
		}
	}
}
