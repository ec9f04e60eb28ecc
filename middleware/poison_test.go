package middleware_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/middleware"
)

// TestPoisonAttributes: a message whose attributes no store can hold, or
// that CloudEvents forbids, ends as a dead letter with
// malformed_envelope at its first delivery, on PostgreSQL as on SQLite:
// never handled, never nacked forever. Its dead letter does not depend
// on the attribute that failed: it is keyed by the hash of the body and
// keeps the body's bytes. The events behind it flow.
func TestPoisonAttributes(t *testing.T) {
	t.Parallel()
	const tail = `"type":"notes.note.added","eventversion":1,"data":{"text":"x"}}`
	bodies := []struct {
		name string
		body string
		key  framework.Key // zero: the hash of the body
	}{
		{"IDEscapedNUL", `{"specversion":"1.0","id":"p\u0000","source":"notes",` + tail, framework.Key{}},
		{"IDRawInvalidUTF8", "{\"specversion\":\"1.0\",\"id\":\"p\xff\xfe\",\"source\":\"notes\"," + tail, framework.Key{}},
		{"IDControlCharacter", `{"specversion":"1.0","id":"p\u001b[31m","source":"notes",` + tail, framework.Key{}},
		{"IDLoneSurrogate", `{"specversion":"1.0","id":"p\ud800","source":"notes",` + tail, framework.Key{}},
		{"SourceEscapedNUL", `{"specversion":"1.0","id":"p1","source":"notes\u0000",` + tail, framework.Key{}},
		{"SourceRawNUL", "{\"specversion\":\"1.0\",\"id\":\"p2\",\"source\":\"notes\x00\"," + tail, framework.Key{}},
		{"SourceRawInvalidUTF8", "{\"specversion\":\"1.0\",\"id\":\"p3\",\"source\":\"notes\xc3\"," + tail, framework.Key{}},
		{"SourceC1Control", `{"specversion":"1.0","id":"p4","source":"notes\u0085",` + tail, framework.Key{}},
		{"SubjectEscapedNUL", `{"specversion":"1.0","id":"p5","source":"notes","subject":"a\u0000",` + tail, framework.Key{Source: "notes", ID: "p5"}},
		{"CorrelationIDInvalidUTF8", "{\"specversion\":\"1.0\",\"id\":\"p6\",\"source\":\"notes\",\"correlationid\":\"\xff\"," + tail, framework.Key{Source: "notes", ID: "p6"}},
		{"FractionalVersion", `{"specversion":"1.0","id":"p7","source":"notes","type":"notes.note.added","eventversion":1.5,"data":{"text":"x"}}`, framework.Key{Source: "notes", ID: "p7"}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, tt := range bodies {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					bd := setup(t, b, setupConfig{maxDeliveries: 3})
					body := []byte(tt.body)
					require.NoError(t, bd.deliver(ctx, body), "acknowledged at its first delivery")
					require.EqualValues(t, 0, bd.calls.Load(), "never handled")
					dls := bd.deadLetters(t)
					require.Len(t, dls, 1)
					dl := dls[0]
					require.Equal(t, framework.CodeMalformedEnvelope, dl.Code)
					want := tt.key
					if want == (framework.Key{}) {
						want = framework.BodyKey(body)
					}
					require.Equal(t, want, dl.Key())
					require.Equal(t, body, dl.Body, "the original bytes")
					require.Equal(t, 0, bd.count(t, `SELECT count(*) FROM deliveries`))

					require.NoError(t, bd.deliver(ctx, body), "a repeat is acknowledged too")
					require.Equal(t, 1, bd.deadLetters(t)[0].Repeats)

					require.NoError(t, bd.deliver(ctx, event(t, "notes", "after")))
					require.Equal(t, 1, bd.effects(t), "the events behind it flow")
				})
			}
		})
	}
}

// TestPoisonMetadata: a poison message's metadata, as the transport
// handed it, is stored with NUL and invalid UTF-8 replaced by U+FFFD
// (PostgreSQL's jsonb refuses NUL even escaped), instead of the dead
// letter failing to store and the message coming back forever.
func TestPoisonMetadata(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bd := setup(t, b, setupConfig{})
			body := []byte(`{"specversion":"1.0","id":"p\u0000","source":"notes"}`)
			msg := message.NewMessage(watermill.NewUUID(), body)
			msg.Metadata = message.Metadata{
				"content-type": framework.ContentType,
				"nul":          "a\x00b",
				"not-utf8":     "a\xffb",
				"key\x00":      "v",
			}
			msg.SetContext(ctx)
			require.NoError(t, bd.handler(msg))
			dls := bd.deadLetters(t)
			require.Len(t, dls, 1)
			require.Equal(t, framework.BodyKey(body), dls[0].Key())
			require.Equal(t, map[string]string{
				"content-type": framework.ContentType,
				"nul":          "a\uFFFDb",
				"not-utf8":     "a\uFFFDb",
				"key\uFFFD":    "v",
			}, dls[0].Metadata)

			require.NoError(t, bd.deliver(ctx, event(t, "notes", "after")))
			require.Equal(t, 1, bd.effects(t), "the events behind it flow")
		})
	}
}

// TestGuardRefusesUnusableKey: in a chain whose decoding lets through a
// key no store can count (here: none but the guard's own checks), the
// delivery guard fails the message permanently instead of failing to
// count it on every delivery; its dead letter is keyed by the body.
func TestGuardRefusesUnusableKey(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			bd := setup(t, b, setupConfig{})
			c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error {
				bd.calls.Add(1)
				return nil
			}))
			require.NoError(t, err)
			lax := func(next message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					env := framework.Envelope{
						Attributes: framework.Attributes{ID: "p\x00", Source: "notes", Type: noted.Type(), Version: 1},
						Data:       []byte(`{"text":"x"}`),
					}
					handle, err := c.Route(env)
					if err != nil {
						return nil, err
					}
					msg.SetContext(pipeline.With(msg.Context(), &pipeline.Decoded[framework.Envelope]{Envelope: env, Handle: handle}))
					return next(msg)
				}
			}
			deadLetter := middleware.DeadLetterStep(consumerName, bd.store)
			guard := middleware.DeliveryGuardStep(consumerName, bd.store)
			h := deadLetter(lax(guard(middleware.Dispatch)))

			body := []byte("a body that says p\x00")
			msg := message.NewMessage(watermill.NewUUID(), body)
			_, err = h(msg)
			require.NoError(t, err, "dead-lettered at the first delivery")
			require.EqualValues(t, 0, bd.calls.Load())
			dls := bd.deadLetters(t)
			require.Len(t, dls, 1)
			require.Equal(t, framework.CodeMalformedEnvelope, dls[0].Code)
			require.Equal(t, framework.BodyKey(body), dls[0].Key())
		})
	}
}

type touchyV1 struct {
	Text string `json:"text"`
}

// Validate panics on "boom", as a payload's own code may.
func (p touchyV1) Validate() error {
	if p.Text == "boom" {
		panic("validate: boom")
	}
	return nil
}

var touched = framework.Define[touchyV1]("notes.note.touched", 1)

// TestDecodePanicIsPoison: a payload whose own code panics while it is
// decoded, before the delivery guard counts it, would take the process
// down on every delivery; it is dead-lettered at once with code panic,
// and the consumer keeps running.
func TestDecodePanicIsPoison(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bd := setup(t, b, setupConfig{})
			c, err := framework.NewConsumer(consumerName, framework.Handle(touched, func(context.Context, framework.Event[touchyV1]) error {
				bd.calls.Add(1)
				return nil
			}))
			require.NoError(t, err)
			h, _, err := middleware.Handler(middleware.Config{
				Consumer: c, UnitOfWork: bd.uow, Store: bd.store,
			})
			require.NoError(t, err)
			deliver := func(text string) error {
				env, err := touched.Envelope(touchyV1{Text: "fine"}, framework.Attributes{ID: text, Source: "notes"})
				require.NoError(t, err)
				env.Data = []byte(`{"text":"` + text + `"}`)
				msg, err := framework.NewMessage(env)
				require.NoError(t, err)
				msg.SetContext(ctx)
				return h(msg)
			}
			require.NotPanics(t, func() { require.NoError(t, deliver("boom")) })
			dls := bd.deadLetters(t)
			require.Len(t, dls, 1)
			require.Equal(t, framework.CodePanic, dls[0].Code)
			require.Equal(t, framework.Key{Source: "notes", ID: "boom"}, dls[0].Key())
			require.NoError(t, deliver("fine"))
			require.EqualValues(t, 1, bd.calls.Load())
		})
	}
}

// TestPoisonDiscardIsFinal: once an operator discards a poison message's
// dead letter, a copy of it that comes later (the same bytes, or a copy
// of the event whose data still fails) is acknowledged as a duplicate:
// the dead letter stays discarded, with no repeat, and no new dead letter
// is stored under another key. A copy of a pending one is a repeat, as
// before.
func TestPoisonDiscardIsFinal(t *testing.T) {
	t.Parallel()
	bodies := map[string][]byte{
		"Malformed":      []byte(`{"specversion":"1.0","id":"p\u0000","source":"notes"}`),
		"InvalidPayload": []byte(`{"specversion":"1.0","id":"p1","source":"notes","type":"notes.note.added","eventversion":1,"data":{"text":""}}`),
		"UnknownType":    []byte(`{"specversion":"1.0","id":"p2","source":"notes","type":"notes.note.gone","eventversion":1,"data":{}}`),
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for name, body := range bodies {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					bd := setup(t, b, setupConfig{maxDeliveries: 3})
					require.Equal(t, framework.DeadLettered, bd.outcome(t, body))
					require.Equal(t, framework.DeadLettered, bd.outcome(t, body), "a repeat while pending")
					dls := bd.deadLetters(t)
					require.Len(t, dls, 1)
					require.Equal(t, 1, dls[0].Repeats)
					_, err := bd.store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"})
					require.NoError(t, err)

					require.Equal(t, framework.Duplicate, bd.outcome(t, body), "discarded for good")
					dls = bd.deadLetters(t)
					require.Len(t, dls, 1, "no dead letter under another key")
					require.Equal(t, driver.DeadLetterDiscarded, dls[0].Status)
					require.Equal(t, 1, dls[0].Repeats)
					require.EqualValues(t, 0, bd.calls.Load(), "never handled")
				})
			}
		})
	}
}
