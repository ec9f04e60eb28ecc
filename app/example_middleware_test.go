package app_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

type InvoiceSentV1 struct {
	InvoiceID string `json:"invoiceId" validate:"required"`
}

var InvoiceSent = framework.Define[InvoiceSentV1]("billing.invoice.sent", 1)

// audit is Outer middleware: it runs once per delivery, with the decoded
// event, outside the retries and the transaction.
func audit(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d, _ := framework.EnvelopeFromContext(msg.Context())
		fmt.Println("outer: delivery of", d.ID)
		return next(msg)
	}
}

// inTx is Inner middleware: it runs in each attempt's transaction, for
// the deliveries that are not duplicates.
func inTx(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		_, ok := driver.TxFromContext(msg.Context())
		fmt.Println("inner: attempt in a transaction:", ok)
		return next(msg)
	}
}

// The application's own middleware sits at two places in every
// consumer's chain: Outer sees each delivery once, Inner each attempt
// inside its transaction. Here the first attempt fails and is retried,
// then the event comes a second time as a duplicate.
func ExampleMiddleware() {
	ctx := context.Background()
	failures := 1
	module := fx.Options(
		fx.Supply(app.Middleware{
			Outer: []message.HandlerMiddleware{audit},
			Inner: []message.HandlerMiddleware{inTx},
		}),
		handlers.Register("billing.archive-invoice",
			handlers.On(InvoiceSent, func(_ context.Context, ev framework.Event[InvoiceSentV1]) error {
				if failures > 0 {
					failures--
					return errors.New("archive unavailable") // retried
				}
				fmt.Println("handler: archived", ev.Data.InvoiceID)
				return nil
			}),
		),
	)
	svc, err := apptest.Start(ctx, module, apptest.Config{}) // the application on a fresh SQLite file
	if err != nil {
		panic(err)
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()

	env, err := InvoiceSent.Envelope(InvoiceSentV1{InvoiceID: "inv-1"}, framework.Attributes{ID: "evt-1", Source: "billing"})
	if err != nil {
		panic(err)
	}
	for range 2 { // the broker delivers it twice
		res, err := svc.Publish(ctx, env)
		fmt.Println(res["billing.archive-invoice"], err)
	}
	// Output:
	// outer: delivery of evt-1
	// inner: attempt in a transaction: true
	// inner: attempt in a transaction: true
	// handler: archived inv-1
	// processed after 2 attempts <nil>
	// outer: delivery of evt-1
	// duplicate after 1 attempts <nil>
}
