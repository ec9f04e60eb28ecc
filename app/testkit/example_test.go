package testkit_test

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
)

type InvoiceSentV1 struct {
	InvoiceID string `json:"invoiceId" validate:"required"`
	Customer  string `json:"customer" validate:"required"`
}

var InvoiceSent = framework.Define[InvoiceSentV1]("billing.invoice.sent", 1)

// A test of a handler through the whole consumer chain on a fresh SQLite
// file: a delivery twice is processed once, a permanent error and poison
// are dead-lettered with their codes. In a test, t is the test's
// *testing.T and the kit cleans up when the test ends.
func Example() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	kit := testkit.New(t, testkit.Config{})
	c := kit.Chain(t, "billing.archive-invoice",
		framework.Handle(InvoiceSent, func(_ context.Context, ev framework.Event[InvoiceSentV1]) error {
			if ev.Data.Customer == "gone" {
				return framework.Permanent("unknown_customer", nil)
			}
			return nil
		}),
	)

	env := testkit.Envelope(t, InvoiceSent, InvoiceSentV1{InvoiceID: "inv-1", Customer: "ada"}, framework.Attributes{})
	res := c.Deliver(ctx, t, env)
	testkit.RequireProcessed(t, res)
	fmt.Println(res)
	res = c.Deliver(ctx, t, env) // the broker delivered it twice
	testkit.RequireDuplicate(t, res)
	fmt.Println(res)

	gone := testkit.Envelope(t, InvoiceSent, InvoiceSentV1{InvoiceID: "inv-2", Customer: "gone"}, framework.Attributes{})
	res = c.Deliver(ctx, t, gone)
	testkit.RequireDeadLettered(t, res, "unknown_customer")
	fmt.Println(res)
	res = c.DeliverBody(ctx, t, []byte("not an event"))
	testkit.RequireDeadLettered(t, res, framework.CodeMalformedEnvelope)
	fmt.Println(res)

	for _, dl := range c.DeadLetters(ctx, t) {
		fmt.Println("dead letter:", dl.Code)
	}
	// Output:
	// processed after 1 attempts
	// duplicate after 1 attempts
	// dead_lettered (unknown_customer) after 1 attempts
	// dead_lettered (malformed_envelope) after 0 attempts
	// dead letter: unknown_customer
	// dead letter: malformed_envelope
}
