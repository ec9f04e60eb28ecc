package middleware

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/effectively/framework"
)

// DefaultTimeout is the default time limit of one attempt.
const DefaultTimeout = 30 * time.Second

// ChainConfig configures the whole chain of one consumer.
type ChainConfig struct {
	// Consumer holds the consumer's name and handlers. Required.
	Consumer *framework.Consumer
	// UnitOfWork runs each attempt in a transaction with the processed
	// mark. Required.
	UnitOfWork *framework.UnitOfWork
	// DeadLetters stores the messages the consumer gives up on. Required.
	DeadLetters framework.Store
	// Deliveries keeps the durable delivery counts of the delivery guard.
	// Required.
	Deliveries framework.Store
	// MaxDeliveries is the delivery limit. Defaults to
	// DefaultMaxDeliveries.
	MaxDeliveries int
	// Retry sets the attempts and the delay between them.
	Retry RetryConfig
	// Timeout limits each attempt. Defaults to DefaultTimeout; negative
	// disables the limit.
	Timeout time.Duration
	// Checkpoints, when set, adds the SequenceGuard inside the unit of
	// work: stale events of a subject are skipped.
	Checkpoints framework.Store
	// Order, when set, applies each subject's events in sequence
	// (StrictOrder, with GapWait after Decode); not with Checkpoints.
	Order framework.Store
	// GapTimeout is how long an event waits for an earlier one of its
	// subject under Order. Defaults to DefaultGapTimeout.
	GapTimeout time.Duration
	// MaxBodyBytes limits message bodies. Defaults to
	// framework.DefaultMaxBodyBytes.
	MaxBodyBytes int
	// Logger, Metrics and Tracer observe the messages (see ObserveConfig).
	Logger  *slog.Logger
	Metrics *Metrics
	Tracer  trace.Tracer
	// Outer middleware runs once per delivery, after Decode (and GapWait)
	// and the DeliveryGuard, outside Retry and the transaction. The
	// message context carries the decoded event:
	// framework.EnvelopeFromContext(msg.Context()) returns it. A permanent
	// error (framework.Permanent) is dead-lettered with its code and the
	// message acknowledged; any other error it returns without calling
	// next nacks the message, which comes back and counts towards
	// MaxDeliveries. Errors of the steps inside pass through it as they
	// are (retries exhausted are dead-lettered).
	Outer []message.HandlerMiddleware
	// Inner middleware runs inside each attempt, after the processed mark:
	// its context carries the transaction.
	Inner []message.HandlerMiddleware
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c ChainConfig) WithDefaults() ChainConfig {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Retry = c.Retry.WithDefaults()
	return c
}

// Validate reports the first invalid field of c.
func (c ChainConfig) Validate() error {
	switch {
	case c.Consumer == nil:
		return errors.New("chain: missing Consumer (build it with framework.NewConsumer)")
	case c.UnitOfWork == nil:
		return errors.New("chain: missing UnitOfWork (build it with framework.NewUnitOfWork)")
	case c.DeadLetters == nil:
		return errors.New("chain: missing DeadLetters")
	case c.Deliveries == nil:
		return errors.New("chain: missing Deliveries")
	case c.Checkpoints != nil && c.Order != nil:
		return errors.New("chain: Checkpoints (skip stale events) and Order (strict order) exclude each other")
	}
	return c.Retry.Validate()
}

// Chain returns the consumer's steps, outermost first, in the order of the
// design: Observe, DeadLetter, Decode, GapWait (with cfg.Order),
// DeliveryGuard, cfg.Outer, Retry, Timeout, Recover, UnitOfWork,
// SequenceGuard (with cfg.Checkpoints) or StrictOrder (with cfg.Order),
// cfg.Inner. Apply them to Dispatch, or use Handler, which does.
func Chain(cfg ChainConfig) ([]message.HandlerMiddleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name := cfg.Consumer.Name()
	limit, forget := holdUp(cfg)
	observe, err := Observe(ObserveConfig{Consumer: name, Logger: cfg.Logger, Metrics: cfg.Metrics, Tracer: cfg.Tracer, HoldUpLimit: limit, ForgetFailingAfter: forget})
	if err != nil {
		return nil, err
	}
	deadLetter, err := DeadLetter(DeadLetterConfig{Consumer: name, Publisher: cfg.DeadLetters})
	if err != nil {
		return nil, err
	}
	guard, err := DeliveryGuard(GuardConfig{Consumer: name, Store: cfg.Deliveries, MaxDeliveries: cfg.MaxDeliveries, UnitOfWork: cfg.UnitOfWork})
	if err != nil {
		return nil, err
	}
	retry, err := Retry(cfg.Retry)
	if err != nil {
		return nil, err
	}
	chain := []message.HandlerMiddleware{observe, deadLetter, Decode(cfg.Consumer, cfg.MaxBodyBytes)}
	if cfg.Order != nil {
		wait, err := GapWait(name, cfg.Order, cfg.GapTimeout)
		if err != nil {
			return nil, err
		}
		chain = append(chain, wait)
	}
	chain = append(chain, guard)
	chain = append(chain, cfg.Outer...)
	chain = append(chain,
		retry,
		Timeout(cfg.Timeout),
		Recover,
		UnitOfWork(name, cfg.UnitOfWork),
	)
	if cfg.Checkpoints != nil {
		guard, err := SequenceGuard(name, cfg.Checkpoints)
		if err != nil {
			return nil, err
		}
		chain = append(chain, guard)
	}
	if cfg.Order != nil {
		order, err := StrictOrder(name, cfg.Order)
		if err != nil {
			return nil, err
		}
		chain = append(chain, order)
	}
	chain = append(chain, cfg.Inner...)
	return chain, nil
}

// Handler returns the consumer's chain applied to Dispatch, ready for
// watermill's Router.AddConsumerHandler. It acknowledges a message (returns
// nil) once its effect committed, it was a duplicate, or it was stored as a
// dead letter; otherwise the message is nacked and delivered again.
func Handler(cfg ChainConfig) (message.NoPublishHandlerFunc, error) {
	chain, err := Chain(cfg)
	if err != nil {
		return nil, err
	}
	h := message.HandlerFunc(Dispatch)
	for i := len(chain) - 1; i >= 0; i-- {
		h = chain[i](h)
	}
	return func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}, nil
}
