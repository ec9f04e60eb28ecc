package outbox

import (
	"context"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// withTraceContext returns env with the trace context of the span in ctx
// in its traceparent and tracestate (the CloudEvents distributed-tracing
// extension): the event's creation context, which the relay's publish
// span and the consumers' spans refer to. An envelope whose producer set
// a traceparent keeps it, and one added without a valid span in ctx
// carries none.
func withTraceContext(ctx context.Context, env framework.Envelope) framework.Envelope {
	if env.TraceParent != "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return env
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	env.TraceParent, env.TraceState = carrier.Get(traceParentKey), carrier.Get(traceStateKey)
	return env
}

// The W3C trace context's names, the CloudEvent's attributes.
const (
	traceParentKey = "traceparent"
	traceStateKey  = "tracestate"
)

// tracer starts the relay's publish spans.
type tracer struct {
	tracer trace.Tracer
	// on is false with a no-op tracer: no span is started and the rows'
	// trace context is not read.
	on     bool
	system attribute.KeyValue // messaging.system, when the config names it
}

// newTracer returns the tracer of t (nil: none) naming system.
func newTracer(t trace.Tracer, system string) tracer {
	if t == nil {
		t = noop.NewTracerProvider().Tracer("")
	}
	_, quiet := t.(noop.Tracer)
	tr := tracer{tracer: t, on: !quiet}
	if system != "" {
		tr.system = semconv.MessagingSystemKey.String(system)
	}
	return tr
}

// startPublish starts the producer span of the publish of row, a child of
// the event's creation context (its traceparent), and sets msg's context
// to one with the span. An event without a creation context gets the
// span's, in msg's payload, as OpenTelemetry's messaging conventions say
// of a publish without one: the consumers link to the publish. Without
// tracing it returns a span that records nothing.
func (t tracer) startPublish(row sqlstore.OutboxRow, msg *message.Message) trace.Span {
	if !t.on {
		return trace.SpanFromContext(context.Background()) // records nothing
	}
	creation := creationContext(row.Body)
	ctx := trace.ContextWithRemoteSpanContext(msg.Context(), creation)
	attrs := make([]attribute.KeyValue, 0, 6)
	if t.system.Valid() {
		attrs = append(attrs, t.system)
	}
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(row.Type),
		semconv.MessagingMessageID(row.Key.ID),
		semconv.CloudEventsEventSource(row.Key.Source),
	)
	ctx, span := t.tracer.Start(ctx, "publish "+row.Type, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	msg.SetContext(ctx)
	if !creation.IsValid() && span.SpanContext().IsValid() {
		if body, ok := stampBody(ctx, row.Body); ok {
			msg.Payload = body
		}
	}
	return span
}

// stampBody returns body, a stored CloudEvent, with the trace context of
// ctx's span as its creation context; false when body does not decode
// (the row is then published as it is).
func stampBody(ctx context.Context, body []byte) ([]byte, bool) {
	env, err := framework.Decode(body, len(body))
	if err != nil {
		return nil, false
	}
	body, err = framework.Encode(withTraceContext(ctx, env))
	if err != nil {
		return nil, false
	}
	return body, true
}

// endPublish ends span, the publish span of a row, with err, what became
// of the publish (nil: the transport took the message).
func endPublish(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeOther)
	}
	span.End()
}

// creationContext returns the trace context in the traceparent and
// tracestate of body, a stored CloudEvent; an invalid one when it carries
// none.
func creationContext(body []byte) trace.SpanContext {
	var attrs struct {
		TraceParent string `json:"traceparent"`
		TraceState  string `json:"tracestate"`
	}
	if json.Unmarshal(body, &attrs) != nil || attrs.TraceParent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{
		traceParentKey: attrs.TraceParent, traceStateKey: attrs.TraceState,
	})
	return trace.SpanContextFromContext(ctx)
}
