package middleware

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// Decode decodes each message as a CloudEvent and routes it to the
// consumer's handler of its type and version, decoding and validating the
// data. A message that fails is poison: the step returns a permanent error
// with its code (malformed_envelope, too_large, unknown_type,
// unsupported_version or invalid_payload) and the message never reaches
// the retries. maxBody limits the body size; zero means
// framework.DefaultMaxBodyBytes.
func Decode(c *framework.Consumer, maxBody int) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			env, err := framework.DecodeMessage(msg, maxBody)
			if err != nil {
				return nil, err
			}
			st.envelope = &env
			d, err := c.Decode(env)
			if err != nil {
				return nil, err
			}
			st.decoded = d
			msg.SetContext(framework.WithDecoded(msg.Context(), d))
			return next(msg)
		}
	}
}

// Dispatch is the innermost handler of a consumer's chain: it runs the
// handler that Decode chose, with the message context (the attempt's
// transaction included).
func Dispatch(msg *message.Message) ([]*message.Message, error) {
	d, ok := framework.DecodedFromContext(msg.Context())
	if !ok {
		return nil, errNotDecoded
	}
	return nil, d.Handle(msg.Context())
}
