package framework_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

type bookedV1 struct {
	AppointmentID string    `json:"appointmentId" validate:"required"`
	StartsAt      time.Time `json:"startsAt" validate:"required"`
}

type note struct {
	Text string `json:"text"`
}

func (n note) Validate() error {
	if n.Text == "" {
		return errors.New("text is empty")
	}
	return nil
}

var (
	booked = framework.Define[bookedV1]("appointments.appointment.booked", 1)
	noted  = framework.Define[note]("notes.note.added", 1)
)

func TestDefinitionNew(t *testing.T) {
	t.Parallel()
	starts := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ev, err := booked.New(bookedV1{AppointmentID: "a", StartsAt: starts}, framework.Attributes{Source: "appointments", Subject: "a", SubjectSeq: 1, CorrelationID: "c"})
	require.NoError(t, err)
	require.NotEmpty(t, ev.ID, "an id is generated")
	require.False(t, ev.Time.IsZero(), "the time is set")
	require.Equal(t, "appointments.appointment.booked", ev.Type)
	require.Equal(t, 1, ev.Version)

	again, err := booked.New(bookedV1{AppointmentID: "a", StartsAt: starts}, framework.Attributes{Source: "appointments"})
	require.NoError(t, err)
	require.NotEqual(t, ev.ID, again.ID)

	given, err := booked.New(bookedV1{AppointmentID: "a", StartsAt: starts}, framework.Attributes{ID: "mine", Source: "appointments"})
	require.NoError(t, err)
	require.Equal(t, "mine", given.ID)

	_, err = booked.New(bookedV1{StartsAt: starts}, framework.Attributes{Source: "appointments"})
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "struct tags validate")
	_, err = noted.New(note{}, framework.Attributes{Source: "notes"})
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "the Validate method validates")
	_, err = noted.New(note{Text: "x"}, framework.Attributes{})
	require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "source is required")
}

func TestDefinitionDecode(t *testing.T) {
	t.Parallel()
	env, err := booked.Envelope(bookedV1{AppointmentID: "a", StartsAt: time.Now()}, framework.Attributes{Source: "appointments"})
	require.NoError(t, err)
	ev, err := booked.Decode(env)
	require.NoError(t, err)
	require.Equal(t, "a", ev.Data.AppointmentID)

	v2 := env
	v2.Version = 2
	_, err = booked.Decode(v2)
	require.Equal(t, framework.CodeUnsupportedVersion, framework.CodeOf(err))

	bad := env
	bad.Data = []byte(`{"appointmentId":""}`)
	_, err = booked.Decode(bad)
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err))

	notObject := env
	notObject.Data = []byte(`"x"`)
	_, err = booked.Decode(notObject)
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err))
}

func TestConsumerDecode(t *testing.T) {
	t.Parallel()
	var got []string
	c, err := framework.NewConsumer("notes.projection",
		framework.Handle(noted, func(_ context.Context, ev framework.Event[note]) error {
			got = append(got, ev.Data.Text)
			return nil
		}),
	)
	require.NoError(t, err)

	env, err := noted.Envelope(note{Text: "hello"}, framework.Attributes{Source: "notes"})
	require.NoError(t, err)
	handle, err := c.Route(env)
	require.NoError(t, err)
	require.NoError(t, handle(context.Background()))
	require.Equal(t, []string{"hello"}, got)

	other := env
	other.Type = "notes.note.removed"
	_, err = c.Route(other)
	require.Equal(t, framework.CodeUnknownType, framework.CodeOf(err))

	v3 := env
	v3.Version = 3
	_, err = c.Route(v3)
	require.Equal(t, framework.CodeUnsupportedVersion, framework.CodeOf(err))
}

func TestNewConsumerRefuses(t *testing.T) {
	t.Parallel()
	h := framework.Handle(noted, func(context.Context, framework.Event[note]) error { return nil })
	_, err := framework.NewConsumer("Bad Name", h)
	require.ErrorContains(t, err, "malformed")
	_, err = framework.NewConsumer("notes.projection", h, h)
	require.ErrorContains(t, err, "two handlers of notes.note.added v1")
	_, err = framework.NewConsumer("notes.projection")
	require.ErrorContains(t, err, "no handlers")
}

func TestValidateConsumerName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "notifications.remind-on-appointment-booked", "billing.v2", "a1.b2-c3"} {
		require.NoError(t, framework.ValidateConsumerName(ok), ok)
	}
	for _, bad := range []string{"", "A", "1abc", "a..b", "a-", "a_b", "amq.x", "a b", string(make([]byte, 121))} {
		require.Error(t, framework.ValidateConsumerName(bad), bad)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	k := framework.IdempotencyKey("notifications.remind", framework.Key{Source: "s", ID: "1"})
	require.Len(t, k, 64)
	require.Equal(t, k, framework.IdempotencyKey("notifications.remind", framework.Key{Source: "s", ID: "1"}))
	require.NotEqual(t, k, framework.IdempotencyKey("notifications.other", framework.Key{Source: "s", ID: "1"}))
	require.NotEqual(t, k, framework.IdempotencyKey("notifications.remind", framework.Key{Source: "t", ID: "1"}))
	require.NotEqual(t, framework.IdempotencyKey("a", framework.Key{Source: "bc", ID: ""}), framework.IdempotencyKey("ab", framework.Key{Source: "c", ID: ""}))
}

func TestCodeOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, framework.Code(""), framework.CodeOf(nil))
	require.Equal(t, framework.CodeRetriesExhausted, framework.CodeOf(errors.New("x")))
	require.Equal(t, framework.CodeTimeout, framework.CodeOf(context.DeadlineExceeded))
	require.Equal(t, framework.Code("card_declined"), framework.CodeOf(framework.Permanent("card_declined", errors.New("x"))))
	require.Equal(t, framework.CodeHandlerFailed, framework.CodeOf(framework.Permanent("Not A Code", nil)))
	wrapped := errors.Join(errors.New("ctx"), framework.Permanent("x_y", nil))
	require.True(t, framework.IsPermanent(wrapped))
	require.ErrorIs(t, wrapped, &framework.PermanentError{})
}

type bookedV2 struct {
	AppointmentID string    `json:"appointmentId" validate:"required"`
	StartsAt      time.Time `json:"startsAt" validate:"required"`
	TimeZone      string    `json:"timeZone" validate:"required"`
}

var bookedTwo = framework.Define[bookedV2]("appointments.appointment.booked", 2)

func TestUpcast(t *testing.T) {
	t.Parallel()
	var got []framework.Event[bookedV2]
	remind := func(_ context.Context, ev framework.Event[bookedV2]) error {
		got = append(got, ev)
		return nil
	}
	c, err := framework.NewConsumer("notifications.remind",
		framework.Handle(bookedTwo, remind),
		framework.Upcast(booked, bookedTwo, func(v1 bookedV1) (bookedV2, error) {
			if v1.AppointmentID == "unconvertible" {
				return bookedV2{}, errors.New("no time zone known")
			}
			return bookedV2{AppointmentID: v1.AppointmentID, StartsAt: v1.StartsAt, TimeZone: "UTC"}, nil
		}, remind),
	)
	require.NoError(t, err)

	starts := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	v1, err := booked.Envelope(bookedV1{AppointmentID: "a", StartsAt: starts}, framework.Attributes{ID: "e1", Source: "appointments"})
	require.NoError(t, err)
	handle, err := c.Route(v1)
	require.NoError(t, err)
	require.NoError(t, handle(context.Background()))
	v2, err := bookedTwo.Envelope(bookedV2{AppointmentID: "b", StartsAt: starts, TimeZone: "Europe/Paris"}, framework.Attributes{ID: "e2", Source: "appointments"})
	require.NoError(t, err)
	handle, err = c.Route(v2)
	require.NoError(t, err)
	require.NoError(t, handle(context.Background()))

	require.Len(t, got, 2)
	require.Equal(t, "UTC", got[0].Data.TimeZone)
	require.Equal(t, 2, got[0].Version, "the handler sees the version it was written for")
	require.Equal(t, framework.Key{Source: "appointments", ID: "e1"}, got[0].Key(), "the event keeps its identity")
	require.Equal(t, "Europe/Paris", got[1].Data.TimeZone)

	bad, err := booked.Envelope(bookedV1{AppointmentID: "unconvertible", StartsAt: starts}, framework.Attributes{Source: "appointments"})
	require.NoError(t, err)
	_, err = c.Route(bad)
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err))

	c3, err := framework.NewConsumer("notifications.remind",
		framework.Upcast(booked, bookedTwo, func(v1 bookedV1) (bookedV2, error) {
			return bookedV2{AppointmentID: v1.AppointmentID, StartsAt: v1.StartsAt}, nil // forgets the time zone
		}, remind),
	)
	require.NoError(t, err)
	_, err = c3.Route(v1)
	require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "the upcast data is validated as the new contract says")
}

func TestFollowUpID(t *testing.T) {
	t.Parallel()
	cause := framework.Key{Source: "appointments", ID: "e-1"}
	id := framework.FollowUpID(cause, "reminder-mail")
	require.Len(t, id, 36)
	require.Equal(t, id, framework.FollowUpID(cause, "reminder-mail"), "the same on every retry")
	require.NotEqual(t, id, framework.FollowUpID(cause, "invoice"))
	require.NotEqual(t, id, framework.FollowUpID(framework.Key{Source: "billing", ID: "e-1"}, "reminder-mail"))
	require.NotEqual(t, framework.FollowUpID(framework.Key{Source: "a", ID: "b\x00c"}, "d"), framework.FollowUpID(framework.Key{Source: "a", ID: "b"}, "c\x00d"),
		"parts are length-prefixed, never confused")
}

// TestNewDefinitionRefuses: an event type names its topic, so one that is
// empty, too long, or takes a prefix of RabbitMQ's exchanges or of the
// consumers' replay topics is refused, as is a version out of range;
// names that only look alike are not.
func TestNewDefinitionRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		typ     string
		version int
		want    string // "" for valid
	}{
		{"", 1, "event type is empty"},
		{strings.Repeat("t", framework.MaxTypeBytes+1), 1, "at most 255 allowed"},
		{"amq.orders.placed", 1, `starts with amq., which names the topics of RabbitMQ's own exchanges`},
		{"effectively.replay.billing", 1, "which names the topics of each consumer's replays"},
		{"orders.placed", 0, "version 0 out of range"},
		{"orders.placed", 1 << 31, "out of range"},
		{"amqp.orders.placed", 1, ""},
		{"effectively.replayed", 1, ""},
		{strings.Repeat("t", framework.MaxTypeBytes), 1 << 30, ""},
	} {
		_, err := framework.NewDefinition[struct{}](c.typ, c.version)
		if c.want == "" {
			require.NoError(t, err, "%.40s v%d", c.typ, c.version)
			continue
		}
		require.ErrorContains(t, err, c.want, "%.40s v%d", c.typ, c.version)
	}
}
