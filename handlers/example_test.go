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

// OrderPlacedV2 is version 2 of the contract's data: it adds the locale
// of the confirmation.
type OrderPlacedV2 struct {
	OrderID string `json:"orderId" validate:"required"`
	Email   string `json:"email" validate:"required,email"`
	Locale  string `json:"locale" validate:"required"`
}

// Two versions of one contract: definitions, values of the same event type.
var (
	OrderPlaced    = framework.Define[OrderPlacedV1]("shop.order.placed", 1)
	OrderPlacedTwo = framework.Define[OrderPlacedV2]("shop.order.placed", 2)
)

// UpcastOrderPlaced converts version 1 to version 2: orders placed before
// the locale existed were confirmed in English.
func UpcastOrderPlaced(v1 OrderPlacedV1) (OrderPlacedV2, error) {
	return OrderPlacedV2{OrderID: v1.OrderID, Email: v1.Email, Locale: "en"}, nil
}

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
func ExampleRegister() {
	var reg *handlers.Registry
	app := fx.New(
		fx.NopLogger,
		fx.Supply(&Mailer{}),
		handlers.Register("shop.confirm-order-by-mail",
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

	bad := fx.New(fx.NopLogger, handlers.Register("Shop Confirm", handlers.On(OrderPlaced, NewConfirmOrder)), handlers.Module)
	fmt.Println(bad.Err() != nil)
	// Output:
	// shop.confirm-order-by-mail [shop.order.placed]
	// true
}

// NewConfirmOrderV2 is the handler of version 2, which the upcast route
// serves as well.
func NewConfirmOrderV2(m *Mailer) framework.HandlerFunc[OrderPlacedV2] {
	return func(_ context.Context, ev framework.Event[OrderPlacedV2]) error {
		m.sent = append(m.sent, fmt.Sprintf("%s in %s (v%d)", ev.Data.Email, ev.Data.Locale, ev.Version))
		return nil
	}
}

// A new version of a contract is a new definition of the same type. The
// consumer handles it, and routes the old version through an upcaster to
// the same handler while producers migrate.
func ExampleUpcast() {
	// snippet:begin upcast
	consumer := handlers.Register("shop.confirm-order-by-mail",
		handlers.On(OrderPlacedTwo, NewConfirmOrderV2),
		handlers.Upcast(OrderPlaced, OrderPlacedTwo, UpcastOrderPlaced, NewConfirmOrderV2),
	)
	// snippet:end upcast

	mailer := &Mailer{}
	var reg *handlers.Registry
	app := fx.New(fx.NopLogger, fx.Supply(mailer), consumer, handlers.Module, fx.Populate(&reg))
	if err := app.Err(); err != nil {
		fmt.Println(err)
		return
	}
	c := reg.Consumers()[0]
	v1, _ := OrderPlaced.Envelope(OrderPlacedV1{OrderID: "o-1", Email: "ada@example.com"}, framework.Attributes{ID: "e-1", Source: "shop"})
	v2, _ := OrderPlacedTwo.Envelope(OrderPlacedV2{OrderID: "o-2", Email: "max@example.com", Locale: "de"}, framework.Attributes{ID: "e-2", Source: "shop"})
	for _, env := range []framework.Envelope{v1, v2} {
		handle, err := c.Route(env) // what the consumer's chain does with each delivery
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := handle(context.Background()); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(c.Types())
	for _, m := range mailer.sent {
		fmt.Println(m)
	}
	// Output:
	// [shop.order.placed]
	// ada@example.com in en (v2)
	// max@example.com in de (v2)
}

// NewIndexOrder writes an order to a search index: an upsert by order id,
// which a redelivery repeats harmlessly.
func NewIndexOrder(index map[string]string) framework.HandlerFunc[OrderPlacedV1] {
	return func(_ context.Context, ev framework.Event[OrderPlacedV1]) error {
		index[ev.Data.OrderID] = ev.Data.Email
		return nil
	}
}

// A consumer whose effect is idempotent by itself may run without
// deduplication, for a reason the application logs at start.
func ExampleWithoutDedup() {
	// snippet:begin without-dedup
	consumer := handlers.Register("shop.index-order",
		handlers.WithoutDedup("the index write is an upsert by order id"),
		handlers.On(OrderPlaced, NewIndexOrder),
	)
	// snippet:end without-dedup

	var reg *handlers.Registry
	app := fx.New(fx.NopLogger, fx.Supply(map[string]string{}), consumer, handlers.Module, fx.Populate(&reg))
	if err := app.Err(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reg.WithoutDedup("shop.index-order"))

	bad := fx.New(fx.NopLogger, handlers.Register("shop.index-order",
		handlers.WithoutDedup(""),
		handlers.On(OrderPlaced, NewIndexOrder),
	), handlers.Module)
	fmt.Println(bad.Err())
	// Output:
	// the index write is an upsert by order id true
	// handlers: consumer shop.index-order: WithoutDedup needs a reason (say why its effect is idempotent without the processed mark)
}
