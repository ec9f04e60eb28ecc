package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Metrics are the Prometheus metrics of every consumer's chain. Create one
// per registry and share it between consumers. Besides counters, it keeps
// each consumer's failing messages (see Consumers).
type Metrics struct {
	messages    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	attempts    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	eventAge    *prometheus.HistogramVec
	failing     *failing
	breakers    *breakers
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_messages_total",
			Help: "Messages handled, by consumer and outcome (processed, duplicate, stale, parked, dead_lettered, nacked).",
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
		eventAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "effectively_event_age_seconds",
			Help:    "Age of each event processed when its handler's work committed, from its CloudEvent time, else from when its transport says it was published, by consumer; events with neither are not observed.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
		}, []string{"consumer"}),
		failing:  newFailing(),
		breakers: newBreakers(),
	}
	for _, c := range []prometheus.Collector{m.messages, m.deadLetters, m.attempts, m.duration, m.eventAge, m.failing, m.breakers} {
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
// as its chain is built (Handler). The same figures are served as the gauges
// effectively_consumer_failing_messages,
// effectively_consumer_oldest_failing_seconds and
// effectively_consumer_hold_up_limit_seconds.
func (m *Metrics) Consumers() []ConsumerStatus { return m.failing.statuses() }

// Breakers returns the state of the circuit breaker of every consumer
// observed with m that has one (Config.Breaker), by name. The same is
// served as the gauge effectively_consumer_breaker_state.
func (m *Metrics) Breakers() []BreakerStatus { return m.breakers.statuses() }

// observer is what the observe step of one consumer needs.
type observer struct {
	consumer string
	logger   *slog.Logger
	metrics  *Metrics
	tracer   trace.Tracer
	spanName string
	// tracing is false with a no-op tracer, which ignores a span's
	// options: they are not built then.
	tracing bool
	// errorText logs errors' text (Settings.LogErrorText).
	errorText bool
	track     *failingConsumer // nil without metrics: tracks nothing
}

// traceOutcome records on span what became of the message, and links it
// to the producer's span (the CloudEvent's traceparent): a link, not a
// parent, as OpenTelemetry's messaging conventions have a process span
// link to the message's creation context. Each delivery is a trace of its
// own: a redelivery, or a replay days later, does not grow the producer's
// trace, and several consumers of one event each link to the same span.
func traceOutcome(ctx context.Context, span trace.Span, st *state, outcome framework.Outcome) {
	switch outcome {
	case framework.Nacked:
		span.SetStatus(codes.Error, "nacked")
	case framework.DeadLettered:
		span.SetStatus(codes.Error, string(st.deadLettered))
	}
	env := st.envelope
	if env == nil {
		return
	}
	span.SetAttributes(attribute.String("messaging.message.id", env.ID), attribute.String("cloudevents.event_type", env.Type))
	if env.CorrelationID != "" {
		span.SetAttributes(attribute.String("messaging.message.conversation_id", env.CorrelationID))
	}
	if env.TraceParent != "" {
		producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{
			"traceparent": env.TraceParent, "tracestate": env.TraceState,
		}))
		if producer.IsValid() {
			span.AddLink(trace.Link{SpanContext: producer})
		}
	}
}

// observe is the outermost step: it logs, counts and traces what became
// of each message, with the event's id, type and correlation id, and keeps
// track of the messages that keep failing (see Metrics.Consumers), their
// ages on clk. cfg has its defaults.
func observe(cfg Config, clk clock) message.HandlerMiddleware {
	o := &observer{
		consumer: cfg.Consumer.Name(), logger: cfg.Logger, metrics: cfg.Metrics, tracer: cfg.Tracer,
		spanName: cfg.Consumer.Name() + " process", errorText: cfg.Settings.LogErrorText,
	}
	_, quiet := cfg.Tracer.(noop.Tracer)
	o.tracing = !quiet
	if cfg.Metrics != nil {
		limit, forget := holdUp(cfg)
		limit = cmp.Or(clk.holdUpLimit, limit)
		forget = cmp.Or(clk.forgetFailingAfter, forget)
		o.track = cfg.Metrics.failing.consumer(o.consumer, limit, forget, clk.now)
	}
	return o.step
}

// step is the observe step.
func (o *observer) step(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		st := stateOf(msg)
		ctx, span := o.startSpan(msg.Context())
		defer span.End()
		msg.SetContext(ctx)
		st.observer, st.msg = o, msg

		out, err := next(msg)
		if err == nil && st.crash != nil {
			err = st.dies(ctx, crash.BeforeAck)
		}

		outcome := outcomeOf(st, err)
		st.reported = outcome
		switch {
		case outcome != framework.Nacked:
			o.track.clear(msg, st)
		case ctx.Err() == nil && !errors.Is(err, pipeline.ErrLater):
			o.track.fail(msg, st)
		}
		if span.IsRecording() {
			traceOutcome(ctx, span, st, outcome)
		}
		o.log(ctx, st, outcome, err)
		if !pipeline.LostTurn(err) { // it runs again: counted then
			o.count(st, outcome, time.Since(start))
		}
		if err != nil && !o.errorText {
			err = redacted(err) // the router logs it (slog resolves LogValue)
		}
		return out, err
	}
}

// startSpan starts the consumer span of a message whose context is ctx.
func (o *observer) startSpan(ctx context.Context) (context.Context, trace.Span) {
	if !o.tracing {
		return o.tracer.Start(ctx, o.spanName)
	}
	return o.tracer.Start(ctx, o.spanName,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.consumer.group.name", o.consumer),
			attribute.String("messaging.destination.name", message.SubscribeTopicFromCtx(ctx)),
		))
}

// attemptFailed logs an attempt of the message of st that failed with
// err, and counts the message as failing.
func (o *observer) attemptFailed(ctx context.Context, st *state, err error) {
	o.logAttempt(ctx, st, err)
	o.track.fail(st.msg, st)
}

// outcomeOf is what became of a message whose chain returned err.
func outcomeOf(st *state, err error) framework.Outcome {
	switch {
	case err != nil:
		return framework.Nacked
	case st.deadLettered != "":
		return framework.DeadLettered
	case st.outcome == framework.Duplicate:
		return framework.Duplicate
	case st.stale:
		return framework.Stale
	case st.parked:
		return framework.Parked
	}
	return framework.Processed
}

// count counts the message in the metrics, if any.
func (o *observer) count(st *state, outcome framework.Outcome, took time.Duration) {
	m := o.metrics
	if m == nil {
		return
	}
	m.messages.WithLabelValues(o.consumer, string(outcome)).Inc()
	m.duration.WithLabelValues(o.consumer, string(outcome)).Observe(took.Seconds())
	if at, ok := eventTime(st); ok && outcome == framework.Processed {
		m.eventAge.WithLabelValues(o.consumer).Observe(max(time.Since(at), 0).Seconds())
	}
	if st.attempts > 0 {
		m.attempts.WithLabelValues(o.consumer).Add(float64(st.attempts))
	}
	if st.deadLettered != "" {
		m.deadLetters.WithLabelValues(o.consumer, string(st.deadLettered)).Inc()
	}
}

// eventTime returns when the event of st was made: its CloudEvent time,
// else when its transport says its message was published
// (framework.MetadataPublishedAt); false with neither, or with a time
// that does not parse.
func eventTime(st *state) (time.Time, bool) {
	if st.envelope != nil && !st.envelope.Time.IsZero() {
		return st.envelope.Time, true
	}
	if st.msg == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, st.msg.Metadata.Get(framework.MetadataPublishedAt))
	return at, err == nil
}

// log logs what became of the message (see Config.Logger).
func (o *observer) log(ctx context.Context, st *state, outcome framework.Outcome, err error) {
	level, text := slog.LevelDebug, "message handled"
	cause := err
	switch {
	case outcome == framework.Nacked && ctx.Err() != nil:
		// The service stopping, or the message's delivery ended under it
		// (a RabbitMQ channel closed: a heartbeat missed by a process
		// that froze).
		level, text = slog.LevelInfo, "attempt cut short by a stop or a lost delivery, rolled back; the message will be delivered again"
	case outcome == framework.Nacked && errors.Is(err, errStopping):
		level, text = slog.LevelInfo, "no further attempt: the service is stopping; the message will be delivered again"
	case outcome == framework.Nacked && errors.Is(err, errUnreachable):
		level, text = slog.LevelWarn, "the database is unreachable: no dead letter, the message will be delivered again"
	case outcome == framework.Nacked && died(err):
		level, text = slog.LevelInfo, "the delivery died at a crash point (injected); the message will be delivered again"
	case outcome == framework.Nacked && pipeline.LostTurn(err):
		level, text = slog.LevelDebug, "the event ahead of it in its subject did not take effect: it runs again once that one is done"
	case outcome == framework.Nacked && errors.Is(err, pipeline.ErrLater):
		level, text = slog.LevelInfo, "message waits, it will be delivered again"
	case outcome == framework.Nacked:
		level, text = slog.LevelError, "message nacked, it will be delivered again"
	case outcome == framework.DeadLettered:
		level, text, cause = slog.LevelWarn, "message dead-lettered", st.cause
	}
	if !o.logger.Enabled(ctx, level) { // spare the attributes of a quiet logger
		return
	}
	attrs := append(o.attrs(st), slog.String("outcome", string(outcome)), slog.Int("attempts", st.attempts))
	if st.deadLettered != "" {
		attrs = append(attrs, slog.String("code", string(st.deadLettered)))
	}
	o.logger.LogAttrs(ctx, level, text, append(attrs, errorAttrs(cause, o.errorText)...)...)
}

// logAttempt logs an attempt that failed, at info level.
func (o *observer) logAttempt(ctx context.Context, st *state, err error) {
	if !o.logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := append(o.attrs(st), slog.Int("attempt", st.attempts))
	// A plain error has no code yet: retries_exhausted only once the
	// attempts ran out.
	if code := framework.CodeOf(err); code != framework.CodeRetriesExhausted {
		attrs = append(attrs, slog.String("code", string(code)))
	}
	o.logger.LogAttrs(ctx, slog.LevelInfo, "attempt failed", append(attrs, errorAttrs(err, o.errorText)...)...)
}

// attrs returns the attributes that name the consumer and the message.
func (o *observer) attrs(st *state) []slog.Attr {
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("consumer", o.consumer))
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

// errorAttrs returns what the log says of err: its text, but for an
// error of the handler's without text (Settings.LogErrorText) the type of
// the error it wraps innermost (error_type), or for a decode or validation
// error of its data that error's own text, which quotes no value
// (framework.FieldError); the field such an error names; and the SQLSTATE
// of a database's error in its chain. A handler's own errors are its to
// word, and may quote the payload's values; the framework's quote none.
func errorAttrs(err error, text bool) []slog.Attr {
	if err == nil {
		return nil
	}
	var attrs []slog.Attr
	fe, field := errors.AsType[*framework.FieldError](err)
	_, handlers := errors.AsType[*handlerError](err)
	switch {
	case text || !handlers && !field:
		attrs = append(attrs, slog.String("error", err.Error()))
	case field:
		attrs = append(attrs, slog.String("error", fe.Error()))
	default:
		attrs = append(attrs, slog.String("error_type", innermostType(err)))
	}
	if field {
		attrs = append(attrs, slog.String("field", fe.Field))
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) && state.SQLState() != "" {
		attrs = append(attrs, slog.String("sqlstate", state.SQLState()))
	}
	return attrs
}

// redacted returns err, but for an error of the handler's one that logs
// (slog.LogValuer) what errorAttrs logs of it without
// Settings.LogErrorText, not the handler's text: the router logs the error
// a chain returns. It is err otherwise: its Error is err's, for the
// transports and the test kits, and errors.Is and As see err.
func redacted(err error) error {
	if _, ok := errors.AsType[*handlerError](err); !ok {
		return err
	}
	var text strings.Builder
	text.WriteString("the handler's error")
	sep := " ("
	for _, a := range errorAttrs(err, false) {
		fmt.Fprintf(&text, "%s%s %s", sep, a.Key, a.Value)
		sep = ", "
	}
	text.WriteString("; its text is logged with log_error_text)")
	return &redactedError{text: text.String(), err: err}
}

// redactedError is an error of the handler's that logs text, not its own
// (see redacted).
type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.err.Error() }
func (e *redactedError) Unwrap() error { return e.err }

// LogValue is what slog logs of e.
func (e *redactedError) LogValue() slog.Value { return slog.StringValue(e.text) }

// innermostType returns the Go type of the error err wraps innermost (of
// several joined, the first's): *pgconn.PgError, say, rather than the
// *fmt.wrapError of the handler's fmt.Errorf around it.
func innermostType(err error) string {
	for {
		switch u := err.(type) { //nolint:errorlint // it walks the chain of wrapped errors itself
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				err = next
				continue
			}
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 && errs[0] != nil {
				err = errs[0]
				continue
			}
		}
		return fmt.Sprintf("%T", err)
	}
}
