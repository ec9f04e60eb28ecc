package driver

import (
	"context"

	"github.com/effectively-once/effectively/framework"
)

// Consume processes one message body for consumer c, without a container
// or a router: it decodes the CloudEvent, routes it to c's handler and runs
// the handler in uow, so that the processed mark and the handler's writes
// commit together. Delivering the same event twice has one effect; the
// second call returns Duplicate.
//
// Consume does not retry and does not dead-letter: a permanent error (see
// IsPermanent) means the message will never succeed. The middleware chain
// of package middleware adds retries, dead letters and the delivery guard
// around the same unit of work.
func Consume(ctx context.Context, c *framework.Consumer, uow *UnitOfWork, body []byte) (framework.Outcome, error) {
	env, err := framework.Decode(body, 0)
	if err != nil {
		return framework.Failed, err
	}
	handle, err := c.Route(env)
	if err != nil {
		return framework.Failed, err
	}
	return uow.Do(ctx, c.Name(), env.Key(), handle)
}
