package framework_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// Mail is an outside service that sends once per idempotency key, as
// payment and messaging providers do.
type Mail struct{ sent map[string]bool }

// Send sends a receipt unless one with key was sent already.
func (m *Mail) Send(key, text string) {
	if m.sent[key] {
		fmt.Println("mail: already sent")
		return
	}
	m.sent[key] = true
	fmt.Println("mail: sent", text)
}

// An outside call is not undone when the attempt rolls back: the handler
// passes the event's idempotency key, and the service sends once although
// the handler ran twice.
func ExampleIdempotencyKeyFromContext() {
	ctx := context.Background()
	uow, done := exampleUnitOfWork(ctx)
	defer done()

	mail := &Mail{sent: map[string]bool{}}
	failures := 1 // the first attempt fails after the call
	consumer, err := framework.NewConsumer("billing.receipt-by-mail",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			key, _ := framework.IdempotencyKeyFromContext(ctx)
			mail.Send(key, "receipt for "+ev.Data.OrderID)
			if failures > 0 {
				failures--
				return errors.New("database is busy")
			}
			return nil
		}),
	)
	if err != nil {
		panic(err)
	}

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 4200}, framework.Attributes{ID: "evt-1", Source: "payments"})
	if err != nil {
		panic(err)
	}
	body, err := framework.Encode(env)
	if err != nil {
		panic(err)
	}
	for range 2 { // the failed attempt rolled back: the message comes again
		outcome, err := driver.Consume(ctx, consumer, uow, body)
		fmt.Println(outcome, err)
	}
	// The key is the same on every delivery to this consumer.
	fmt.Println(mail.sent[framework.IdempotencyKey("billing.receipt-by-mail", env.Key())])
	// Output:
	// mail: sent receipt for o-1
	// failed database is busy
	// mail: already sent
	// processed <nil>
	// true
}
