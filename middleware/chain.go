package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/keypath"
)

// Defaults of Settings.
const (
	// DefaultAttempts is the default number of attempts per delivery.
	DefaultAttempts = 3
	// DefaultRetryDelay is the default pause between attempts.
	DefaultRetryDelay = time.Second
	// DefaultTimeout is the default time limit of one attempt.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxDeliveries is the default delivery limit of a message.
	DefaultMaxDeliveries = 10
	// DefaultGapTimeout is how long an event waits for an earlier one of
	// its subject before it is dead-lettered with code sequence_gap.
	DefaultGapTimeout = 10 * time.Minute
)

// Config is one consumer's chain: what Handler builds, its Settings and
// what it runs with. Zero fields take their defaults (see WithDefaults).
type Config struct {
	// Consumer holds the consumer's name and handlers. Required.
	Consumer *framework.Consumer
	// UnitOfWork runs each attempt in a transaction with the processed
	// mark. Required.
	UnitOfWork *driver.UnitOfWork
	// Store keeps the dead letters, the durable delivery counts and the
	// subjects' checkpoints (SkipStale, StrictOrder). Required.
	Store driver.Store
	// Settings are the consumer's settings: retries, time limits,
	// ordering, breaker (see Settings). Concurrency and the batch
	// settings are the runner's: Handler uses UnitOfWork as it is.
	Settings
	// Logger logs each failed attempt at info level, with its error; each
	// message dead-lettered at warn, with its code and the error that
	// decided it; each nack at error (at info when cut short by shutdown
	// or waiting for an earlier event); processed, duplicate and stale
	// messages at debug. Every line names the consumer and, once decoded,
	// the event's source, id and type. Decode and validation errors name
	// the field, never the value (see framework.FieldError). Defaults to
	// a logger that discards.
	Logger *slog.Logger
	// Metrics, when set, counts outcomes, codes, attempts and durations,
	// and keeps the consumer's failing messages (see Metrics.Consumers).
	Metrics *Metrics
	// Tracer starts a consumer span per message, linked to the producer's
	// trace context (the CloudEvent's traceparent). Defaults to a no-op
	// tracer.
	Tracer trace.Tracer
	// Outer middleware runs once per delivery, after decoding, the
	// delivery guard and the rate limit, outside the retries and the
	// transaction. The message context carries the decoded event:
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
	// Acker, when set, acknowledges each message inside the transaction
	// of its attempt, so that the effect and the ack commit together: the
	// runner sets it to the consumer's subscriber when that is a
	// driver.TxAcker (the sqlite transport's). Defaults to nil: the
	// message is acked once its chain returns.
	Acker driver.TxAcker
	// Fencer, when set, checks in each attempt's transaction, before its
	// commit, that this process still owns the partition its message
	// came from (driver.PartitionFromContext): the runner sets it for a
	// partitioned consumer. An attempt whose partition moved to another
	// process rolls back and its message is nacked, its delivery not
	// counted. Defaults to nil: no check.
	Fencer driver.Fencer
	// Stopping, when set, is closed when the service begins to stop
	// (runner.Runner.Stop closes it): from then on no further attempt of
	// a message starts. The attempt in flight runs to its end; a message
	// whose attempt failed, or that waits RetryDelay for its next one
	// (the wait ends at once), is nacked without a dead letter, and its
	// next delivery has all its Attempts. A message's first attempt
	// still runs. Defaults to nil: never closed.
	Stopping <-chan struct{}
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Settings = c.Settings.WithDefaults()
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	c.Tracer = cmp.Or(c.Tracer, noop.NewTracerProvider().Tracer(""))
	return c
}

// Validate reports the first missing dependency of c, else every
// invalid setting (see Settings.Validate), named Config.Settings.<key>.
func (c Config) Validate() error {
	switch {
	case c.Consumer == nil:
		return errors.New("Config.Consumer: required (build it with framework.NewConsumer)")
	case c.UnitOfWork == nil:
		return errors.New("Config.UnitOfWork: required (build it with driver.NewUnitOfWork)")
	case c.Store == nil:
		return errors.New("Config.Store: required (try the store of sqlite, postgres or memory)")
	}
	return keypath.Prefix("Config.Settings", c.Settings.Validate())
}

// Handler returns the consumer's whole chain (see the package
// documentation for its steps), ready for watermill's
// Router.AddConsumerHandler, and its sweep. The chain acknowledges a
// message (returns nil) once its effect committed, it was a duplicate or
// stale, or it was stored as a dead letter; otherwise the message is
// nacked and delivered again.
//
// sweep is the chain's work that no message drives: under StrictOrder it
// runs until ctx ends and, at least every DefaultReleaseSweep (and at
// once) while no message does it, releases the parked events whose turn
// came and hands over, as sequence_gap dead letters, those that waited
// longer than GapTimeout for an earlier event that never came: a consumer
// that receives nothing more ends their wait too. Without StrictOrder it
// has nothing to do and returns at once. Run it on a goroutine of its
// own while the handler runs, and wait for it before the store's
// database closes.
func Handler(cfg Config) (h message.NoPublishHandlerFunc, sweep func(ctx context.Context), err error) {
	return handler(cfg, systemClock())
}

// clock is the time of the chain's steps: the age of failing messages,
// the time of dead letters and the rate limit's waits. Tests set their
// own.
type clock struct {
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
	// holdUpLimit and forgetFailingAfter, when set, replace what the
	// chain derives from its Config (see holdUp).
	holdUpLimit, forgetFailingAfter time.Duration
	// releaseSweep is how often the parked events are swept (see
	// releaseParked).
	releaseSweep time.Duration
}

// systemClock is the clock of the system.
func systemClock() clock {
	return clock{now: time.Now, after: time.After, releaseSweep: DefaultReleaseSweep}
}

// handler is Handler on clk.
func handler(cfg Config, clk clock) (message.NoPublishHandlerFunc, func(context.Context), error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("middleware: %w", err)
	}
	steps, rel := chain(cfg, clk)
	h := message.HandlerFunc(dispatch)
	for i := len(steps) - 1; i >= 0; i-- {
		h = steps[i](h)
	}
	sweep := func(context.Context) {} // nothing to sweep
	if rel != nil {
		sweep = rel.run
	}
	return func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}, sweep, nil
}

// chain returns the steps of cfg, outermost first, in the order of the
// package documentation, and under StrictOrder the releaser of its parked
// events. cfg has its defaults and is valid.
func chain(cfg Config, clk clock) ([]message.HandlerMiddleware, *releaser) {
	name := cfg.Consumer.Name()
	var (
		steps []message.HandlerMiddleware
		rel   *releaser
	)
	if cfg.StrictOrder {
		rel = newReleaser(name, cfg.Store, cfg.Logger, clk.now, clk.releaseSweep, cfg.GapTimeout)
		steps = append(steps, rel.middleware)
	}
	steps = append(steps,
		observe(cfg, clk),
		deadLetter(name, cfg.Store, clk.now, cfg.StrictOrder),
		decode(cfg.Consumer, cfg.MaxBodyBytes),
	)
	var brk *breaker
	if cfg.Breaker.Failures > 0 {
		brk = newBreaker(cfg, clk)
		steps = append(steps, brk.gate)
	}
	if cfg.StrictOrder {
		steps = append(steps, gapWait(name, cfg.Store, cfg.GapTimeout))
	}
	steps = append(steps, deliveryGuard(name, cfg.Store, cfg.MaxDeliveries, cfg.Timeout, cfg.UnitOfWork, cfg.Acker, cfg.Stopping))
	if cfg.RateLimit > 0 {
		steps = append(steps, rateLimit(cfg.RateLimit, clk))
	}
	steps = append(steps, cfg.Outer...)
	steps = append(steps, retry(cfg.Attempts, cfg.RetryDelay, cfg.Stopping, cfg.UnitOfWork.Ping))
	if brk != nil {
		steps = append(steps, brk.count)
	}
	steps = append(steps,
		timeout(cfg.Timeout),
		recoverPanic,
		unitOfWork(name, cfg.UnitOfWork, cfg.Acker, cfg.Fencer, cfg.StrictOrder),
	)
	if cfg.SkipStale {
		steps = append(steps, sequenceGuard(name, cfg.Store))
	}
	if cfg.StrictOrder {
		steps = append(steps, strictOrder(name, cfg.Store, cfg.OrderFromFirstSeen))
	}
	return append(steps, cfg.Inner...), rel
}
