package framework_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// A handler marks an error that retrying cannot fix as permanent, with a
// code: the consumer chain then dead-letters the message at once, after
// one attempt, and the dead letter keeps the code (never the error's
// text) for an operator. The attempt rolls back, its processed mark
// included. (The test kit's example shows the dead letter itself.)
func ExamplePermanent() {
	ctx := context.Background()
	uow, done := exampleUnitOfWork(ctx)
	defer done()
	consumer, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(_ context.Context, ev framework.Event[PaymentCaptured]) error {
			return framework.Permanent("unknown_order", errors.New("no order "+ev.Data.OrderID))
		}),
	)
	if err != nil {
		panic(err)
	}

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-9", Cents: 100}, framework.Attributes{ID: "evt-9", Source: "payments"})
	if err != nil {
		panic(err)
	}
	body, err := framework.Encode(env)
	if err != nil {
		panic(err)
	}
	outcome, err := driver.Consume(ctx, consumer, uow, body)
	fmt.Println(outcome, framework.IsPermanent(err), framework.CodeOf(err))
	fmt.Println(err)
	// Output:
	// failed true unknown_order
	// permanent (unknown_order): no order o-9
}
