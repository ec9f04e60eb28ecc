package framework_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// A handler marks an error that retrying cannot fix as permanent, with a
// code: the message is dead-lettered at once, after one attempt, and the
// dead letter keeps the code (never the error's text) for an operator.
func ExamplePermanent() {
	ctx := context.Background()
	module := handlers.Consumer("billing.ledger",
		handlers.On(Captured, func(_ context.Context, ev framework.Event[PaymentCaptured]) error {
			return framework.Permanent("unknown_order", errors.New("no order "+ev.Data.OrderID))
		}),
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

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-9", Cents: 100}, framework.Attributes{ID: "evt-9", Source: "payments"})
	if err != nil {
		panic(err)
	}
	res, err := svc.Publish(ctx, env)
	fmt.Println(res["billing.ledger"], err)

	dls, err := svc.Store().DeadLetters(ctx, framework.DeadLetterFilter{Consumer: "billing.ledger"})
	if err != nil {
		panic(err)
	}
	for _, dl := range dls {
		fmt.Println(dl.EventID, dl.Code, dl.Attempts, dl.Status)
	}
	// Output:
	// dead_lettered (unknown_order) after 1 attempts <nil>
	// evt-9 unknown_order 1 pending
}
