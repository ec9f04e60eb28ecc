package extensions_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing/fstest"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/examples/extensions"
	"github.com/effectively-once/effectively/framework"
)

// schema creates the table the handler writes to.
var schema = fstest.MapFS{"00001_shipments.sql": {Data: []byte(`-- +goose Up
CREATE TABLE shipments (order_id TEXT NOT NULL, carrier TEXT NOT NULL);
-- +goose Down
DROP TABLE shipments;
`)}}

// carrierAPI stands for a carrier's tracking API: it registers each
// idempotency key once, knows no "pigeon", and is down for the first
// call about order o-2.
type carrierAPI struct {
	mu      sync.Mutex
	tracked map[string]bool
	downFor map[string]bool
}

func (c *carrierAPI) Track(_ context.Context, key, order, carrier string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case carrier == "pigeon":
		return fmt.Errorf("track %s: %w", order, extensions.ErrUnknownCarrier)
	case c.downFor[order]:
		delete(c.downFor, order)
		return errors.New("carrier API: connection refused")
	}
	c.tracked[key] = true
	return nil
}

// The handler of the README's extension points in the real application
// on SQLite: a shipment tracked once although delivered twice, one
// retried while the carrier's API is down, one dead-lettered with its
// code; a follow-up event per shipment in the outbox, and the after-commit
// hook run once per effect.
func Example() {
	ctx := context.Background()
	api := &carrierAPI{tracked: map[string]bool{}, downFor: map[string]bool{"o-2": true}}
	tracking := &extensions.Tracking{}
	svc, err := apptest.Start(ctx, fx.Options(
		extensions.Module,
		fx.Supply(app.Migrations{FS: schema}, tracking),
		fx.Supply(fx.Annotate(api, fx.As(new(extensions.Tracker)))),
	), apptest.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()

	const consumer = "shop.track-shipment"
	for _, s := range []struct{ id, order, carrier string }{
		{"e-1", "o-1", "parcelco"},
		{"e-1", "o-1", "parcelco"}, // delivered twice
		{"e-2", "o-2", "parcelco"}, // the API is down at the first attempt
		{"e-3", "o-3", "pigeon"},
	} {
		env, err := extensions.Shipped.Envelope(extensions.ShippedV1{OrderID: s.order, Carrier: s.carrier},
			framework.Attributes{ID: s.id, Source: "shop"})
		if err != nil {
			fmt.Println(err)
			return
		}
		res, err := svc.Publish(ctx, env)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(s.order, res[consumer])
	}
	var shipments, followUps int
	if err := svc.DB().GetContext(ctx, &shipments, `SELECT count(*) FROM shipments`); err != nil {
		fmt.Println(err)
		return
	}
	if err := svc.DB().GetContext(ctx, &followUps, `SELECT count(*) FROM outbox WHERE type = 'shop.shipment.tracked'`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("shipments:", shipments, "follow-ups:", followUps, "committed:", tracking.Committed.Load(), "tracked:", len(api.tracked))
	// Output:
	// o-1 processed after 1 attempts
	// o-1 duplicate after 1 attempts
	// o-2 processed after 2 attempts
	// o-3 dead_lettered (unknown_carrier) after 1 attempts
	// shipments: 2 follow-ups: 2 committed: 2 tracked: 2
}
