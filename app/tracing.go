package app

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/fx"
)

// TracerName is the instrumentation scope of the framework's spans: the
// consumers' (middleware) and the outbox relay's.
const TracerName = "github.com/effectively-once/effectively"

// The OpenTelemetry environment variables that the application reads
// itself; the SDK and its exporters read the others (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_*...).
const (
	envTracesExporter = "OTEL_TRACES_EXPORTER"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
)

// tracingParams are what newTracer takes from fx.
type tracingParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	// Provider is the application's own, when it supplies one.
	Provider trace.TracerProvider `optional:"true"`
}

// newTracer returns the tracer of the framework's spans.
//
// With a trace.TracerProvider supplied to the application, it is that
// provider's, and the application configures nothing: the provider, its
// shutdown and OpenTelemetry's globals stay its owner's.
//
// Otherwise the application configures OpenTelemetry from the standard
// environment variables (see tracerProviderFromEnv), sets OpenTelemetry's
// global propagator to W3C trace context and baggage and, when it built a
// provider, sets it as the global tracer provider too (so that the
// handlers' own spans, otel.Tracer(...), join the same pipeline) and shuts
// it down when the application stops, which flushes the spans still
// buffered.
func newTracer(p tracingParams) (trace.Tracer, error) {
	if p.Provider != nil {
		return p.Provider.Tracer(TracerName), nil
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !tracesOn() {
		return noop.NewTracerProvider().Tracer(TracerName), nil
	}
	tp, err := tracerProviderFromEnv(context.Background())
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(tp)
	p.Lifecycle.Append(fx.StopHook(func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("tracing: shut the tracer provider down: %w", err)
		}
		return nil
	}))
	return tp.Tracer(TracerName), nil
}

// tracesOn reports whether the environment turns traces on: they are off
// unless OTEL_TRACES_EXPORTER names an exporter (otlp, console). Unlike
// OpenTelemetry's own default (otlp), an application without the variable
// dials no collector. "none", or OTEL_SDK_DISABLED true, turn traces off
// too.
func tracesOn() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv(envSDKDisabled)), "true") {
		return false
	}
	exporter := strings.TrimSpace(os.Getenv(envTracesExporter))
	return exporter != "" && exporter != "none"
}

// tracerProviderFromEnv returns a tracer provider configured by the
// OpenTelemetry environment variables of the process. The exporter follows
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf
// by default, or grpc) and the other OTEL_EXPORTER_OTLP_* variables; the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the sampler
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (parentbased_always_on
// by default); the batching OTEL_BSP_*.
func tracerProviderFromEnv(ctx context.Context) (*sdktrace.TracerProvider, error) {
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: %s: %w", envTracesExporter, err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp)), nil
}

// messagingSystem is the messaging.system attribute of the spans of
// transport: OpenTelemetry's name of the broker (rabbitmq), the
// transport's name otherwise.
func messagingSystem(transport string) string {
	switch transport {
	case TransportAMQP:
		return "rabbitmq"
	case TransportPostgres:
		return "postgresql"
	}
	return transport
}
