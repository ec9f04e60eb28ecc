package framework_test

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/memory"
)

type PaymentCaptured struct {
	OrderID string `json:"orderId" validate:"required"`
	Cents   int64  `json:"cents" validate:"gt=0"`
}

var Captured = framework.Define[PaymentCaptured]("payments.payment.captured", 1)

// Consume processes an event once, however often it is delivered. The
// in-memory store protects one process; use the sqlite or postgres store
// to make the mark commit with the handler's writes.
func Example_consume() {
	ctx := context.Background()
	store := memory.NewStore()
	uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{Processed: store, Deliveries: store})
	if err != nil {
		panic(err)
	}
	consumer, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			fmt.Printf("ledger: order %s, %d cents\n", ev.Data.OrderID, ev.Data.Cents)
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
	for range 2 { // the broker delivers it twice
		outcome, err := framework.Consume(ctx, consumer, uow, body)
		fmt.Println(outcome, err)
	}

	_, err = framework.Consume(ctx, consumer, uow, []byte(`{"specversion":"1.0"}`))
	fmt.Println(framework.CodeOf(err))
	// Output:
	// ledger: order o-1, 4200 cents
	// processed <nil>
	// duplicate <nil>
	// malformed_envelope
}
