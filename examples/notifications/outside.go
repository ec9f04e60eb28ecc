package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// EnvOutsideWait is the variable that, set to a Go duration ("10ms"),
// makes the handler wait that long before its insert, as a handler that calls an outside
// service (a mailer, an HTTP endpoint) does. The benchmark's outside-call
// scenario sets it; unset or zero, the handler does not wait.
const EnvOutsideWait = "NOTIFICATIONS_OUTSIDE_WAIT"

// serviceModule returns Module, or, when wait (the value of
// EnvOutsideWait) names a positive duration, the same service whose
// handler waits that long before its insert.
func serviceModule(wait string) fx.Option {
	if wait == "" {
		return Module
	}
	d, err := time.ParseDuration(wait)
	if err != nil || d < 0 {
		return fx.Error(fmt.Errorf("%s: want a duration such as 10ms, got %q", EnvOutsideWait, wait))
	}
	if d == 0 {
		return Module
	}
	return fx.Options(
		handlers.Register(ConsumerName,
			handlers.On(appointments.Booked, func(db *sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
				return waitFirst(d, NewRemindOnBooked(db))
			}),
		),
		fx.Supply(app.Migrations{FS: mustSub(migrations, "migrations")}),
	)
}

// waitFirst returns h preceded by a wait of d, or until ctx ends.
func waitFirst[T any](d time.Duration, h framework.HandlerFunc[T]) framework.HandlerFunc[T] {
	return func(ctx context.Context, ev framework.Event[T]) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("outside call: %w", ctx.Err())
		}
		return h(ctx, ev)
	}
}
