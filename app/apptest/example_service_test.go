package apptest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
)

// Settings are the shop's own settings: the service: section of its
// configuration file.
type Settings struct {
	// Paused are the sources whose orders wait: a middleware of the
	// service's refuses them.
	Paused []string `yaml:"paused_sources"`
}

// snippet:begin apptest-service
// pauseSources is the service's middleware, built from its settings: it
// refuses, for good, the events of the paused sources.
func pauseSources(s Settings) app.Middleware {
	return app.Middleware{Outer: []message.HandlerMiddleware{
		func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				ev, ok := framework.EnvelopeFromContext(msg.Context())
				if ok && slices.Contains(s.Paused, ev.Source) {
					return nil, framework.Permanent("source_paused", errors.New("the source is paused"))
				}
				return next(msg)
			}
		},
	}}
}

// newConfirmOrder confirms an order, and publishes the confirmation
// through the outbox, in the handler's transaction.
func newConfirmOrder(box *outbox.Outbox) framework.HandlerFunc[PlacedV1] {
	return func(ctx context.Context, ev framework.Event[PlacedV1]) error {
		env, err := Confirmed.Envelope(ConfirmedV1{OrderID: ev.Data.OrderID}, framework.Attributes{
			ID: framework.FollowUpID(ev.Key(), "confirmed"), Source: "shop",
		})
		if err != nil {
			return err
		}
		return box.Add(ctx, env) // published once the handler's transaction commits
	}
}

var shop = fx.Options(
	fx.Provide(app.ServiceConfig[Settings], pauseSources),
	handlers.Register("shop.confirm-order", handlers.On(Placed, newConfirmOrder)),
	handlers.Register("shop.ship-order", handlers.On(Confirmed, func(_ context.Context, ev framework.Event[ConfirmedV1]) error {
		fmt.Println("shipping order", ev.Data.OrderID)
		return nil
	})),
)

// snippet:end apptest-service

// The service's own settings (its service: section), a middleware built
// from them and a handler that publishes through the outbox, in the real
// application: the kit takes the section as YAML (Config.Service), the
// module decodes it as in production, and the confirmation the handler
// adds is relayed and handled by the second consumer.
func Example_service() {
	ctx := context.Background()
	// snippet:begin apptest-service-run
	svc, err := apptest.Start(ctx, shop, apptest.Config{
		Service: "paused_sources: [legacy-shop]\n",
	})
	// snippet:end apptest-service-run
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()
	for _, source := range []string{"shop", "legacy-shop"} {
		env, err := Placed.Envelope(PlacedV1{OrderID: "o-" + source}, framework.Attributes{ID: "evt-1", Source: source})
		if err != nil {
			fmt.Println(err)
			return
		}
		res, err := svc.Publish(ctx, env)
		fmt.Println(source+":", res["shop.confirm-order"], err)
		if source == "shop" {
			followUp := framework.Key{Source: "shop", ID: framework.FollowUpID(env.Key(), "confirmed")}
			got, err := svc.Await(ctx, "shop.ship-order", followUp)
			fmt.Println("confirmation:", got, err)
		}
	}
	// Output:
	// shop: processed after 1 attempts <nil>
	// shipping order o-shop
	// confirmation: processed after 1 attempts <nil>
	// legacy-shop: dead_lettered (source_paused) after 0 attempts <nil>
}
