package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// DeadLetterConfig configures DeadLetter.
type DeadLetterConfig struct {
	// Consumer is the consumer's name. Required.
	Consumer string
	// Publisher stores dead letters durably. Required.
	Publisher framework.DeadLetterPublisher
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c DeadLetterConfig) WithDefaults() DeadLetterConfig {
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c.
func (c DeadLetterConfig) Validate() error {
	switch {
	case c.Consumer == "":
		return errors.New("dead letter: missing Consumer")
	case c.Publisher == nil:
		return errors.New("dead letter: missing Publisher (try the store of sqlite, postgres or memory)")
	}
	return nil
}

// DeadLetter hands messages that will not be processed to cfg.Publisher
// and acknowledges them once it stored them: those that failed permanently
// (poison, a permanent handler error, the delivery limit) and those whose
// attempts all failed. The dead letter records a code (framework.CodeOf),
// never the error's text, which may quote payload data.
//
// It never dead-letters on shutdown: when the message context ended, the
// error is returned and the message is delivered again later; the same for
// framework.ErrLater. Nor does it dead-letter an error that is not
// permanent and did not come from Retry giving up (a failure to count the
// delivery, an Outer middleware's transient error): that message is
// delivered again, and counts towards the delivery limit. When storing
// the dead letter fails, the message is not acknowledged.
func DeadLetter(cfg DeadLetterConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			st := stateOf(msg)
			ctx := msg.Context()
			out, err := next(msg)
			msg.SetContext(ctx)
			if err == nil {
				return out, nil
			}
			if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, framework.ErrLater) {
				return nil, err // shutdown, or a wait: deliver again later
			}
			if !framework.IsPermanent(err) && !st.gaveUp {
				return nil, err // before the attempts, or after they succeeded
			}
			dl := cfg.deadLetter(msg, st, framework.CodeOf(err))
			if perr := cfg.Publisher.PublishDeadLetter(ctx, dl); perr != nil {
				return nil, fmt.Errorf("store dead letter (%s) of %s: %w", dl.Code, dl.Key(), errors.Join(perr, err))
			}
			st.deadLettered, st.cause, st.deadLetterKey = dl.Code, err, dl.Key()
			return nil, nil
		}
	}, nil
}

func (c DeadLetterConfig) deadLetter(msg *message.Message, st *state, code framework.Code) framework.DeadLetter {
	now := c.Now().UTC()
	dl := framework.DeadLetter{
		Consumer:      c.Consumer,
		Topic:         message.SubscribeTopicFromCtx(msg.Context()),
		Code:          code,
		Attempts:      st.attempts,
		FirstFailedAt: now,
		LastFailedAt:  now,
		Body:          msg.Payload,
		Metadata:      maps.Clone(map[string]string(msg.Metadata)),
		Status:        framework.DeadLetterPending,
	}
	if env := st.envelope; env != nil {
		dl.Source, dl.EventID = env.Source, env.ID
		dl.Type, dl.Version = env.Type, env.Version
		dl.Subject, dl.CorrelationID = env.Subject, env.CorrelationID
		return dl
	}
	key := keyOfPoison(msg.Payload)
	dl.Source, dl.EventID = key.Source, key.ID
	return dl
}

// keyOfPoison returns the source and id of a body that did not decode, when
// it has readable ones within limits, else the hash of the body.
func keyOfPoison(body []byte) framework.Key {
	var attrs struct {
		ID     string `json:"id"`
		Source string `json:"source"`
	}
	if json.Unmarshal(body, &attrs) == nil && attrs.ID != "" && attrs.Source != "" &&
		len(attrs.ID) <= framework.MaxIDBytes && len(attrs.Source) <= framework.MaxSourceBytes {
		return framework.Key{Source: attrs.Source, ID: attrs.ID}
	}
	return framework.BodyKey(body)
}
