package handlers_test

import (
	"context"
	"fmt"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

type Mailer struct{ sent []string }

type OrderPlacedV1 struct {
	OrderID string `json:"orderId" validate:"required"`
	Email   string `json:"email" validate:"required,email"`
}

var OrderPlaced = framework.Define[OrderPlacedV1]("shop.order.placed", 1)

// NewConfirmOrder is a handler constructor: fx injects its dependencies.
func NewConfirmOrder(m *Mailer) framework.HandlerFunc[OrderPlacedV1] {
	return func(ctx context.Context, ev framework.Event[OrderPlacedV1]) error {
		key, _ := framework.IdempotencyKeyFromContext(ctx) // pass it to the mail service
		_ = key
		m.sent = append(m.sent, ev.Data.Email)
		return nil
	}
}

// Consumers are declared as fx options; the registry checks them when the
// application is built.
func ExampleConsumer() {
	var reg *handlers.Registry
	app := fx.New(
		fx.NopLogger,
		fx.Supply(&Mailer{}),
		handlers.Consumer("shop.confirm-order-by-mail",
			handlers.On(OrderPlaced, NewConfirmOrder),
		),
		handlers.Module,
		fx.Populate(&reg),
	)
	if err := app.Err(); err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range reg.Consumers() {
		fmt.Println(c.Name(), c.Types())
	}

	bad := fx.New(fx.NopLogger, handlers.Consumer("Shop Confirm", handlers.On(OrderPlaced, NewConfirmOrder)), handlers.Module)
	fmt.Println(bad.Err() != nil)
	// Output:
	// shop.confirm-order-by-mail [shop.order.placed]
	// true
}
