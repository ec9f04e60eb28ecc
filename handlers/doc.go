// Package handlers registers consumers declaratively, as fx options.
//
// # Declaring a consumer
//
// A consumer is a stable name and the handlers of the events it consumes,
// one per event type and version. Each handler is a plain function, a value
// with a Handle method, or a constructor whose dependencies fx injects:
//
//	var Module = fx.Options(
//		handlers.Register("notifications.remind-on-appointment-booked",
//			handlers.On(appointments.Booked, NewRemindOnBooked),
//		),
//	)
//
//	func NewRemindOnBooked(db *sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
//		return func(ctx context.Context, ev framework.Event[appointments.BookedV1]) error {
//			_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO reminders ...`)
//			return err
//		}
//	}
//
// When a contract gets a new version, a new framework.Define of the same
// event type, the consumer handles the new version and routes the old one
// through an upcaster to the same handler. Upcast takes the two
// definitions (values, not the data types), a func(Old) (New, error) and
// the handler of the new version (ExampleUpcast runs this):
//
//	consumer := handlers.Register("shop.confirm-order-by-mail",
//		handlers.On(OrderPlacedTwo, NewConfirmOrderV2),
//		handlers.Upcast(OrderPlaced, OrderPlacedTwo, UpcastOrderPlaced, NewConfirmOrderV2),
//	)
//
// where
//
//	OrderPlaced    = framework.Define[OrderPlacedV1]("shop.order.placed", 1)
//	OrderPlacedTwo = framework.Define[OrderPlacedV2]("shop.order.placed", 2)
//	func UpcastOrderPlaced(v1 OrderPlacedV1) (OrderPlacedV2, error)
//
// # Checks at start
//
// Module provides the Registry of every declared consumer. Building it
// refuses start-up, naming the culprit, when a name is malformed or declared
// twice, when a consumer has two handlers of one event type and version,
// or when it is declared WithoutDedup without a reason.
//
// # Without deduplication
//
// A consumer whose effect is idempotent by itself may take no processed
// marks: WithoutDedup("reason") among its routes. Every delivery then
// runs its handler, in its transaction as before; the Registry and the
// consumer's Declaration carry the reason, and the application logs it at
// start.
// Group order in fx is random; nothing here depends on it.
package handlers
