// Package extensions is the README's list of extension points, compiled:
// a handler that tells the framework what became of its work (done,
// retried, dead-lettered, a dependency down), passes the event's
// idempotency key to an outside service, publishes a follow-up event
// through the outbox and runs code once its effect commits; and the
// registration of a consumer that was renamed. Its Example runs them in
// the real application on SQLite. A test in internal/docs keeps the
// README's Go blocks and the code between the snippet markers the same.
package extensions

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
)

// ShippedV1 is the data of "an order was shipped", version 1.
type ShippedV1 struct {
	OrderID string `json:"orderId" validate:"required"`
	Carrier string `json:"carrier" validate:"required"`
}

// Shipped is the contract of "an order was shipped".
var Shipped = framework.Define[ShippedV1]("shop.order.shipped", 1)

// TrackedV1 is the data of "a shipment is tracked", version 1: the
// follow-up event the handler publishes.
type TrackedV1 struct {
	OrderID string `json:"orderId" validate:"required"`
}

// Tracked is the contract of "a shipment is tracked".
var Tracked = framework.Define[TrackedV1]("shop.shipment.tracked", 1)

// ErrUnknownCarrier is what a Tracker returns for a carrier it does not
// know: retrying cannot help.
var ErrUnknownCarrier = errors.New("unknown carrier")

// Tracker is the outside service the handler calls: a carrier's API.
type Tracker interface {
	// Track registers the shipment of order with carrier. A repeat of the
	// same idempotency key must not register it twice.
	Track(ctx context.Context, idempotencyKey, order, carrier string) error
}

// Tracking counts the shipments whose tracking committed: what the
// handler does after the commit.
type Tracking struct{ Committed atomic.Int64 }

// snippet:begin handler

// NewTrackShipment returns the handler of Shipped: it registers the
// shipment with the carrier, records it, and publishes Tracked.
func NewTrackShipment(db *sqlx.DB, box *outbox.Outbox, tracker Tracker, tracking *Tracking) framework.HandlerFunc[ShippedV1] {
	insert := db.Rebind(`INSERT INTO shipments (order_id, carrier) VALUES (?, ?)`)
	return func(ctx context.Context, ev framework.Event[ShippedV1]) error {
		key, _ := framework.IdempotencyKeyFromContext(ctx) // the same for every delivery of the event
		err := tracker.Track(ctx, key, ev.Data.OrderID, ev.Data.Carrier)
		switch {
		case errors.Is(err, ErrUnknownCarrier):
			return framework.Permanent("unknown_carrier", err) // dead-lettered at once, with this code
		case err != nil:
			return framework.Dependency(err) // retried; counts towards the consumer's circuit breaker
		}
		if _, err := framework.Conn(ctx, db).ExecContext(ctx, insert, ev.Data.OrderID, ev.Data.Carrier); err != nil {
			return err // retried, then dead-lettered as retries_exhausted
		}
		next, err := Tracked.Envelope(TrackedV1{OrderID: ev.Data.OrderID}, framework.Attributes{
			ID:     framework.FollowUpID(framework.Key{Source: ev.Source, ID: ev.ID}, "tracked"), // the same on a retry
			Source: "shipping",
		})
		if err != nil {
			return err
		}
		if err := box.Add(ctx, next); err != nil { // published after the commit, never after a rollback
			return err
		}
		if tx, ok := driver.TxFromContext(ctx); ok {
			tx.OnCommit(func() { tracking.Committed.Add(1) }) // once the effect committed
		}
		return nil
	}
}

// snippet:end handler

// snippet:begin register

// Module declares the consumer. It was called shop.shipment-tracker: at
// start it adopts that name's processed marks, checkpoints, dead letters
// and delivery counts, so no event takes effect twice across the rename.
var Module = handlers.Register("shop.track-shipment",
	handlers.RenamedFrom("shop.shipment-tracker"),
	handlers.On(Shipped, NewTrackShipment),
)

// snippet:end register
