package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// trimmed has a Validate method on its pointer that changes the data.
type trimmed struct {
	Text string `json:"text"`
}

func (t *trimmed) Validate() error {
	if t.Text == "" {
		return errors.New("text is empty")
	}
	t.Text = "changed by Validate"
	return nil
}

// pointed is handled by pointer: Definition[*pointed].
type pointed struct {
	Text string `json:"text" validate:"required"`
}

func (p *pointed) Validate() error {
	if p.Text == "bad" {
		return errors.New("bad text")
	}
	return nil
}

// TestDefinitionCallsValidate: decoding calls the data's Validate method
// whatever its receiver (value, pointer, or a pointer payload), and the
// `validate` tags; a Validate on a pointer works on a copy, so what it
// changes never reaches the handler.
func TestDefinitionCallsValidate(t *testing.T) {
	t.Parallel()
	env := func(data string) framework.Envelope {
		return framework.Envelope{
			Attributes: framework.Attributes{ID: "1", Source: "s", Type: "t", Version: 1},
			Data:       json.RawMessage(data),
		}
	}
	t.Run("ValueReceiver", func(t *testing.T) {
		t.Parallel()
		def := framework.Define[note]("t", 1)
		_, err := def.Decode(env(`{"text":""}`))
		require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "%v", err)
		ev, err := def.Decode(env(`{"text":"a"}`))
		require.NoError(t, err)
		require.Equal(t, "a", ev.Data.Text)
	})
	t.Run("PointerReceiver", func(t *testing.T) {
		t.Parallel()
		def := framework.Define[trimmed]("t", 1)
		_, err := def.Decode(env(`{"text":""}`))
		require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "%v", err)
		ev, err := def.Decode(env(`{"text":"a"}`))
		require.NoError(t, err)
		require.Equal(t, "a", ev.Data.Text, "Validate changed the data")
		var got string
		c, err := framework.NewConsumer("c", framework.Handle(def, func(_ context.Context, ev framework.Event[trimmed]) error {
			got = ev.Data.Text
			return nil
		}))
		require.NoError(t, err)
		handle, err := c.Route(env(`{"text":"a"}`))
		require.NoError(t, err)
		require.NoError(t, handle(context.Background()))
		require.Equal(t, "a", got, "Validate changed the data the handler got")
	})
	t.Run("PointerPayload", func(t *testing.T) {
		t.Parallel()
		def := framework.Define[*pointed]("t", 1)
		_, err := def.Decode(env(`{"text":"bad"}`))
		require.Equal(t, framework.CodeInvalidPayload, framework.CodeOf(err), "Validate of *pointed: %v", err)
		_, err = def.Decode(env(`{"text":""}`))
		fe, ok := errors.AsType[*framework.FieldError](err)
		require.True(t, ok, "validate tags of *pointed: %v", err)
		require.Equal(t, "data.text", fe.Field)
		ev, err := def.Decode(env(`{"text":"a"}`))
		require.NoError(t, err)
		require.Equal(t, "a", ev.Data.Text)
	})
	t.Run("InterfacePayload", func(t *testing.T) {
		t.Parallel()
		ev, err := framework.Define[any]("t", 1).Decode(env(`{"text":"a"}`))
		require.NoError(t, err)
		require.Equal(t, map[string]any{"text": "a"}, ev.Data)
	})
}

// TestRouteAllocations pins the cost of what the chain's decode step does
// per message: Decode, then Route, which decodes the data into the event
// the handler gets (one copy of it) and validates it through a validator
// built once per definition, boxing nothing but the struct it validates.
// The rest is encoding/json's.
func TestRouteAllocations(t *testing.T) {
	c, err := framework.NewConsumer("bench.consumer", framework.Handle(booked, func(context.Context, framework.Event[bookedV1]) error {
		return nil
	}))
	require.NoError(t, err)
	body := []byte(typicalBody)
	allocs := testing.AllocsPerRun(100, func() {
		env, err := framework.Decode(body, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Route(env); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 10.0+raceAllocs)
}
