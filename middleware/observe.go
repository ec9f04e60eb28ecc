package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// The outcomes Observe reports, as the label "outcome" of its metrics.
const (
	OutcomeProcessed    = "processed"
	OutcomeDuplicate    = "duplicate"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeNacked       = "nacked"
	OutcomeStale        = "stale"
)

// Metrics are the Prometheus metrics of every consumer's chain. Create one
// per registry and share it between consumers. Besides counters, it keeps
// each consumer's failing messages (see Consumers).
type Metrics struct {
	messages    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	attempts    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	failing     *failing
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_messages_total",
			Help: "Messages handled, by consumer and outcome (processed, duplicate, stale, dead_lettered, nacked).",
		}, []string{"consumer", "outcome"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_dead_letters_total",
			Help: "Messages dead-lettered, by consumer and code.",
		}, []string{"consumer", "code"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_attempts_total",
			Help: "Attempts made, retries included, by consumer.",
		}, []string{"consumer"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "effectively_message_duration_seconds",
			Help:    "Time from receiving a message to its ack or nack, by consumer and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"consumer", "outcome"}),
		failing: newFailing(),
	}
	for _, c := range []prometheus.Collector{m.messages, m.deadLetters, m.attempts, m.duration, m.failing} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// Messages returns the counter of messages by consumer and outcome.
func (m *Metrics) Messages() *prometheus.CounterVec { return m.messages }

// DeadLetters returns the counter of dead letters by consumer and code.
func (m *Metrics) DeadLetters() *prometheus.CounterVec { return m.deadLetters }

// Consumers returns the status of the failing messages of every consumer
// observed with m, by name: a consumer appears, with none failing, as soon
// as its Observe step is built. The same figures are served as the gauges
// effectively_consumer_failing_messages,
// effectively_consumer_oldest_failing_seconds and
// effectively_consumer_hold_up_limit_seconds.
func (m *Metrics) Consumers() []ConsumerStatus { return m.failing.statuses() }

// ObserveConfig configures Observe.
type ObserveConfig struct {
	// Consumer is the consumer's name. Required.
	Consumer string
	// Logger logs each failed attempt at info level, with its error; each
	// message dead-lettered at warn, with its code and the error that
	// decided it; each nack at error (at info when cut short by shutdown or
	// waiting for an earlier event); processed, duplicate and stale
	// messages at debug. Every line names the consumer and, once decoded,
	// the event's source, id and type. Decode and validation errors name
	// the field, never the value (see framework.FieldError). Defaults to a
	// logger that discards.
	Logger *slog.Logger
	// Metrics, when set, counts outcomes, codes, attempts and durations,
	// and keeps the consumer's failing messages: a message is failing from
	// its first failed attempt or nack (not one cut short by shutdown or
	// waiting for an earlier event) until it is acknowledged or
	// dead-lettered in this process.
	Metrics *Metrics
	// HoldUpLimit is the longest a message should keep failing before the
	// chain dead-letters it: MaxDeliveries × Attempts × (Timeout + Delay).
	// Chain sets it; zero when attempts have no timeout. Reported with the
	// failing messages (ConsumerStatus).
	HoldUpLimit time.Duration
	// ForgetFailingAfter is how long a failing message that fails no more
	// in this process stays counted as failing: by then it went to another
	// process, or its event was handled there. Chain sets it to one
	// delivery's attempts, Attempts × (Timeout + Delay), plus a minute.
	// Defaults to DefaultForgetFailingAfter.
	ForgetFailingAfter time.Duration
	// Now returns the current time, for the age of failing messages.
	// Defaults to time.Now.
	Now func() time.Time
	// Tracer starts a consumer span per message, linked to the producer's
	// trace context (the CloudEvent's traceparent). Defaults to a no-op
	// tracer.
	Tracer trace.Tracer
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c ObserveConfig) WithDefaults() ObserveConfig {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tracer == nil {
		c.Tracer = noop.NewTracerProvider().Tracer("")
	}
	c.ForgetFailingAfter = cmp.Or(c.ForgetFailingAfter, DefaultForgetFailingAfter)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c.
func (c ObserveConfig) Validate() error {
	switch {
	case c.Consumer == "":
		return errors.New("observe: missing Consumer")
	case c.HoldUpLimit < 0:
		return fmt.Errorf("observe: HoldUpLimit must not be negative, got %s", c.HoldUpLimit)
	case c.ForgetFailingAfter < 0:
		return fmt.Errorf("observe: ForgetFailingAfter must not be negative, got %s", c.ForgetFailingAfter)
	}
	return nil
}

// traceOutcome records on span what became of the message, and links it
// to the producer's span (the CloudEvent's traceparent).
func traceOutcome(ctx context.Context, span trace.Span, st *state, outcome string) {
	switch outcome {
	case OutcomeNacked:
		span.SetStatus(codes.Error, "nacked")
	case OutcomeDeadLettered:
		span.SetStatus(codes.Error, string(st.deadLettered))
	}
	env := st.envelope
	if env == nil {
		return
	}
	span.SetAttributes(attribute.String("messaging.message.id", env.ID), attribute.String("cloudevents.event_type", env.Type))
	if env.TraceParent != "" {
		producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{
			"traceparent": env.TraceParent, "tracestate": env.TraceState,
		}))
		if producer.IsValid() {
			span.AddLink(trace.Link{SpanContext: producer})
		}
	}
}

// Observe is the outermost step: it logs, counts and traces what became of
// each message, with the event's id, type and correlation id, and keeps
// track of the messages that keep failing (see Metrics.Consumers).
func Observe(cfg ObserveConfig) (message.HandlerMiddleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var track *failingConsumer // nil without Metrics: tracks nothing
	if cfg.Metrics != nil {
		track = cfg.Metrics.failing.consumer(cfg.Consumer, cfg.HoldUpLimit, cfg.ForgetFailingAfter, cfg.Now)
	}
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			start := time.Now()
			st := stateOf(msg)
			ctx, span := cfg.Tracer.Start(msg.Context(), cfg.Consumer+" process",
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					attribute.String("messaging.consumer.group.name", cfg.Consumer),
					attribute.String("messaging.destination.name", message.SubscribeTopicFromCtx(msg.Context())),
				))
			defer span.End()
			msg.SetContext(ctx)
			key := func() framework.Key { return messageKey(msg, st) }
			st.attemptFailed = func(ctx context.Context, err error) {
				cfg.logAttempt(ctx, st, err)
				track.fail(key)
			}

			out, err := next(msg)

			outcome := OutcomeProcessed
			switch {
			case err != nil:
				outcome = OutcomeNacked
			case st.deadLettered != "":
				outcome = OutcomeDeadLettered
			case st.outcome == framework.Duplicate:
				outcome = OutcomeDuplicate
			case st.stale:
				outcome = OutcomeStale
			}
			st.reported = outcome
			switch {
			case outcome != OutcomeNacked:
				track.clear(key)
			case ctx.Err() == nil && !errors.Is(err, pipeline.ErrLater):
				track.fail(key)
			}
			if span.IsRecording() {
				traceOutcome(ctx, span, st, outcome)
			}
			cfg.log(ctx, st, outcome, err)
			if m := cfg.Metrics; m != nil {
				m.messages.WithLabelValues(cfg.Consumer, outcome).Inc()
				m.duration.WithLabelValues(cfg.Consumer, outcome).Observe(time.Since(start).Seconds())
				if st.attempts > 0 {
					m.attempts.WithLabelValues(cfg.Consumer).Add(float64(st.attempts))
				}
				if st.deadLettered != "" {
					m.deadLetters.WithLabelValues(cfg.Consumer, string(st.deadLettered)).Inc()
				}
			}
			return out, err
		}
	}, nil
}

// log logs what became of the message (see ObserveConfig.Logger).
func (c ObserveConfig) log(ctx context.Context, st *state, outcome string, err error) {
	level, text := slog.LevelDebug, "message handled"
	cause := err
	switch {
	case outcome == OutcomeNacked && ctx.Err() != nil:
		level, text = slog.LevelInfo, "attempt cut short by shutdown, rolled back; the message will be delivered again"
	case outcome == OutcomeNacked && errors.Is(err, pipeline.ErrLater):
		level, text = slog.LevelInfo, "message waits, it will be delivered again"
	case outcome == OutcomeNacked:
		level, text = slog.LevelError, "message nacked, it will be delivered again"
	case outcome == OutcomeDeadLettered:
		level, text, cause = slog.LevelWarn, "message dead-lettered", st.cause
	}
	if !c.Logger.Enabled(ctx, level) { // spare the attributes of a quiet logger
		return
	}
	attrs := append(c.attrs(st), slog.String("outcome", outcome), slog.Int("attempts", st.attempts))
	if st.deadLettered != "" {
		attrs = append(attrs, slog.String("code", string(st.deadLettered)))
	}
	c.Logger.LogAttrs(ctx, level, text, append(attrs, errorAttrs(cause)...)...)
}

// logAttempt logs an attempt that failed, at info level.
func (c ObserveConfig) logAttempt(ctx context.Context, st *state, err error) {
	if !c.Logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := append(c.attrs(st), slog.Int("attempt", st.attempts))
	// A plain error has no code yet: retries_exhausted only once the
	// attempts ran out.
	if code := framework.CodeOf(err); code != framework.CodeRetriesExhausted {
		attrs = append(attrs, slog.String("code", string(code)))
	}
	c.Logger.LogAttrs(ctx, slog.LevelInfo, "attempt failed", append(attrs, errorAttrs(err)...)...)
}

// attrs returns the attributes that name the consumer and the message.
func (c ObserveConfig) attrs(st *state) []slog.Attr {
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("consumer", c.Consumer))
	switch env := st.envelope; {
	case env != nil:
		attrs = append(attrs, slog.String("source", env.Source), slog.String("event_id", env.ID), slog.String("type", env.Type))
		if env.CorrelationID != "" {
			attrs = append(attrs, slog.String("correlation_id", env.CorrelationID))
		}
	case st.deadLetterKey != framework.Key{}:
		attrs = append(attrs, slog.String("source", st.deadLetterKey.Source), slog.String("event_id", st.deadLetterKey.ID))
	}
	return attrs
}

// errorAttrs returns err's text and, for a decode or validation error, the
// field it names. The framework's decode and validation errors quote no
// value (framework.FieldError); the handler's own errors are its to word.
func errorAttrs(err error) []slog.Attr {
	if err == nil {
		return nil
	}
	attrs := []slog.Attr{slog.String("error", err.Error())}
	if fe, ok := errors.AsType[*framework.FieldError](err); ok {
		attrs = append(attrs, slog.String("field", fe.Field))
	}
	return attrs
}
