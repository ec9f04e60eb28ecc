package middleware

import (
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// decode decodes each message as a CloudEvent and routes it to the
// consumer's handler of its type and version, decoding and validating the
// data. A message that fails is poison: the step returns a permanent error
// with its code (malformed_envelope, too_large, unknown_type,
// unsupported_version or invalid_payload) and the message never reaches
// the retries. maxBody limits the body size; zero means
// framework.DefaultMaxBodyBytes.
//
// Decoding runs the payload's own code (a Validate method, an upcast)
// before the delivery guard counts the message: a panic there is caught
// and fails the message permanently with code panic, since it would panic
// again on every delivery, instead of taking the process down each time.
func decode(c *framework.Consumer, maxBody int) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			if err := decodeInto(c, msg, st, maxBody); err != nil {
				return nil, err
			}
			msg.SetContext(pipeline.With(msg.Context(), st.decoded))
			if err := st.dies(msg.Context(), crash.AfterDecode); err != nil {
				return nil, err
			}
			return next(msg)
		}
	}
}

// decodeInto decodes msg into st: its envelope, then its routed data.
func decodeInto(c *framework.Consumer, msg *message.Message, st *state, maxBody int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = framework.Permanent(framework.CodePanic, fmt.Errorf("decode message %s: %w", msg.UUID,
				wmmiddleware.RecoveredPanicError{V: r, Stacktrace: string(debug.Stack())}))
		}
	}()
	env := &st.event.Envelope // decoded in place: no copy on the stack
	if r, ok := pipeline.From[*pipeline.Read[framework.Envelope]](msg.Context()); ok {
		*env = r.Envelope // read ahead of the chain, by the same decoder
	} else if *env, err = driver.DecodeMessage(msg, maxBody); err != nil {
		return err
	}
	st.envelope = env
	if st.event.Handle, err = c.Route(*env); err != nil {
		return err
	}
	st.event.Consumer = c.Name()
	st.decoded = &st.event
	return nil
}

// dispatch is the innermost handler of a consumer's chain: it runs the
// handler that decode chose, with the message context (the attempt's
// transaction included).
func dispatch(msg *message.Message) ([]*message.Message, error) {
	d, ok := pipeline.From[*decoded](msg.Context())
	if !ok {
		return nil, errNotDecoded
	}
	if err := d.Handle(msg.Context()); err != nil {
		return nil, &handlerError{err: err}
	}
	return nil, nil
}

// handlerError is an error of the handler's (or of its event's data): the
// log says its text only with Settings.LogErrorText (see errorAttrs), as
// it may quote the payload's values. It is err to errors.Is and As.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }
