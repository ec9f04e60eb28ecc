package handlers_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

type booked struct {
	AppointmentID string `json:"appointmentId" validate:"required"`
}

type cancelled struct {
	AppointmentID string `json:"appointmentId"`
}

var (
	bookedV1    = framework.Define[booked]("appointments.appointment.booked", 1)
	bookedV2    = framework.Define[booked]("appointments.appointment.booked", 2)
	cancelledV1 = framework.Define[cancelled]("appointments.appointment.cancelled", 1)
)

// repo stands for a dependency that fx injects into a handler constructor.
type repo struct{ seen []string }

type remind struct{ repo *repo }

func (r *remind) Handle(_ context.Context, ev framework.Event[booked]) error {
	r.repo.seen = append(r.repo.seen, ev.Data.AppointmentID)
	return nil
}

func newRemind(r *repo) *remind { return &remind{repo: r} }

func start(t *testing.T, opts ...fx.Option) (*handlers.Registry, error) {
	t.Helper()
	var reg *handlers.Registry
	app := fx.New(append(opts, handlers.Module, fx.NopLogger, fx.Populate(&reg))...)
	return reg, app.Err()
}

func TestRegistry(t *testing.T) {
	t.Parallel()

	t.Run("HandlerShapes", func(t *testing.T) {
		t.Parallel()
		r := &repo{}
		reg, err := start(t,
			fx.Supply(r),
			handlers.Register("projections.appointments",
				handlers.On(bookedV1, newRemind),
				handlers.On(bookedV2, func(context.Context, framework.Event[booked]) error { return nil }),
				handlers.On(cancelledV1, func(r *repo) (framework.HandlerFunc[cancelled], error) {
					return func(context.Context, framework.Event[cancelled]) error { return nil }, nil
				}),
			),
			handlers.Register("notifications.remind", handlers.On(bookedV1, &remind{repo: r})),
		)
		require.NoError(t, err)
		cs := reg.Consumers()
		require.Len(t, cs, 2)
		require.Equal(t, "notifications.remind", cs[0].Name())
		require.Equal(t, []string{"appointments.appointment.booked", "appointments.appointment.cancelled"}, cs[1].Types())

		env, err := bookedV1.Envelope(booked{AppointmentID: "a-1"}, framework.Attributes{Source: "test"})
		require.NoError(t, err)
		handle, err := cs[1].Route(env)
		require.NoError(t, err)
		require.NoError(t, handle(context.Background()))
		require.Equal(t, []string{"a-1"}, r.seen, "the constructor got the injected dependency")
	})

	t.Run("Upcast", func(t *testing.T) {
		t.Parallel()
		r := &repo{}
		newRemindV2 := func(r *repo) framework.HandlerFunc[booked] {
			return func(_ context.Context, ev framework.Event[booked]) error {
				r.seen = append(r.seen, fmt.Sprintf("%s v%d", ev.Data.AppointmentID, ev.Version))
				return nil
			}
		}
		reg, err := start(t, fx.Supply(r),
			handlers.Register("notifications.remind",
				handlers.On(bookedV2, newRemindV2),
				handlers.Upcast(bookedV1, bookedV2, func(old booked) (booked, error) {
					old.AppointmentID += "-upcast"
					return old, nil
				}, newRemindV2),
			),
		)
		require.NoError(t, err)
		c := reg.Consumers()[0]
		for _, def := range []framework.Definition[booked]{bookedV1, bookedV2} {
			env, err := def.Envelope(booked{AppointmentID: "a"}, framework.Attributes{Source: "test"})
			require.NoError(t, err)
			handle, err := c.Route(env)
			require.NoError(t, err)
			require.NoError(t, handle(context.Background()))
		}
		require.Equal(t, []string{"a-upcast v2", "a v2"}, r.seen)
	})

	t.Run("RenamedFrom", func(t *testing.T) {
		t.Parallel()
		reg, err := start(t, fx.Supply(&repo{}),
			handlers.Register("notifications.remind",
				handlers.RenamedFrom("notifications.booking-reminder"),
				handlers.On(bookedV1, newRemind),
			),
		)
		require.NoError(t, err)
		require.Equal(t, []string{"notifications.booking-reminder"}, reg.RenamedFrom("notifications.remind"))
		require.Empty(t, reg.RenamedFrom("other"))

		for name, tt := range map[string]struct {
			opts []fx.Option
			want string
		}{
			"Malformed":  {[]fx.Option{handlers.Register("a.b", handlers.RenamedFrom("Old Name"), handlers.On(bookedV1, newRemind))}, `consumer a.b renamed from: consumer name "Old Name" is malformed`},
			"Itself":     {[]fx.Option{handlers.Register("a.b", handlers.RenamedFrom("a.b"), handlers.On(bookedV1, newRemind))}, "consumer a.b is renamed from itself"},
			"OnlyRename": {[]fx.Option{handlers.Register("a.b", handlers.RenamedFrom("a.c"))}, "has no routes"},
			"StillDeclared": {[]fx.Option{
				handlers.Register("a.b", handlers.RenamedFrom("a.c"), handlers.On(bookedV1, newRemind)),
				handlers.Register("a.c", handlers.On(bookedV1, newRemind)),
			}, "consumer a.b is renamed from a.c, which is still declared"},
			"ClaimedTwice": {[]fx.Option{
				handlers.Register("a.b", handlers.RenamedFrom("a.old"), handlers.On(bookedV1, newRemind)),
				handlers.Register("a.c", handlers.RenamedFrom("a.old"), handlers.On(bookedV1, newRemind)),
			}, "consumers a.b and a.c are both renamed from a.old"},
		} {
			_, err := start(t, append(tt.opts, fx.Supply(&repo{}))...)
			require.ErrorContains(t, err, tt.want, name)
		}
	})

	t.Run("MalformedName", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, handlers.Register("Notifications_Remind", handlers.On(bookedV1, newRemind)), fx.Supply(&repo{}))
		require.ErrorContains(t, err, `consumer name "Notifications_Remind" is malformed`)
	})

	t.Run("ReservedName", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, handlers.Register("amq.remind", handlers.On(bookedV1, newRemind)), fx.Supply(&repo{}))
		require.ErrorContains(t, err, "amq.")
	})

	t.Run("DuplicateName", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, fx.Supply(&repo{}),
			handlers.Register("notifications.remind", handlers.On(bookedV1, newRemind)),
			handlers.Register("notifications.remind", handlers.On(cancelledV1, func(context.Context, framework.Event[cancelled]) error { return nil })),
		)
		require.ErrorContains(t, err, "consumer name declared more than once: notifications.remind")
	})

	t.Run("TwoHandlersOfOneType", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, fx.Supply(&repo{}),
			handlers.Register("notifications.remind",
				handlers.On(bookedV1, newRemind),
				handlers.On(bookedV1, func(context.Context, framework.Event[booked]) error { return nil }),
			),
		)
		require.ErrorContains(t, err, "consumer notifications.remind has two handlers of appointments.appointment.booked v1")
	})

	t.Run("WrongShape", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, handlers.Register("notifications.remind", handlers.On(bookedV1, func(int) string { return "" })))
		require.ErrorContains(t, err, "consumer notifications.remind, appointments.appointment.booked v1")
	})

	t.Run("HandlerOfOtherEvents", func(t *testing.T) {
		// A handler of another event type is named as such, not taken
		// for a constructor that returns an error.
		t.Parallel()
		_, err := start(t, handlers.Register("notifications.remind",
			handlers.On(bookedV1, func(context.Context, framework.Event[cancelled]) error { return nil })))
		require.ErrorContains(t, err, "handles framework.Event[github.com/effectively-once/effectively/handlers_test.cancelled]: this route is of framework.Event[github.com/effectively-once/effectively/handlers_test.booked]")
	})

	t.Run("NoRoutes", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, handlers.Register("notifications.remind"))
		require.ErrorContains(t, err, "has no routes")
	})
}
