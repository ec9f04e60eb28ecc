package apptest_test

import (
	"context"
	"fmt"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// A service's module runs in the real application on a fresh SQLite file:
// an event published twice takes effect once, and poison is dead-lettered
// with its code. In a test, apptest.New(t, module, cfg) does the Start and
// the Close.
func Example() {
	ctx := context.Background()
	module := fx.Options(
		handlers.Register("shop.confirm-order",
			handlers.On(Placed, func(_ context.Context, ev framework.Event[PlacedV1]) error {
				fmt.Println("confirming order", ev.Data.OrderID)
				return nil
			}),
		),
	)
	svc, err := apptest.Start(ctx, module, apptest.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()

	env, err := Placed.Envelope(PlacedV1{OrderID: "o-1"}, framework.Attributes{ID: "evt-1", Source: "shop"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 { // the broker delivers it twice
		res, err := svc.Publish(ctx, env)
		fmt.Println(res["shop.confirm-order"], err)
	}
	res, err := svc.PublishBody(ctx, Placed.Type(), []byte(`{"specversion":"1.0"}`))
	fmt.Println(res["shop.confirm-order"], err)
	// Output:
	// confirming order o-1
	// processed after 1 attempts <nil>
	// duplicate after 1 attempts <nil>
	// dead_lettered (malformed_envelope) after 0 attempts <nil>
}
