package app_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/fx"
	"google.golang.org/protobuf/proto"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
)

// addWidget records a widget.added event with the outbox, in a transaction
// of the test's own under ctx, the producer's.
func addWidget(ctx context.Context, t *testing.T, db *sqlx.DB, box *outbox.Outbox, id string) {
	t.Helper()
	env, err := widgetAdded.Envelope(widgetAddedV1{Name: "sprocket"}, framework.Attributes{ID: id, Source: "widgets"})
	require.NoError(t, err)
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, box.AddTx(ctx, tx, env))
	require.NoError(t, tx.Commit())
}

// newStoreTraced is the traced consumer's handler: one row per event, on
// either database.
func newStoreTraced(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
	return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES ('traced', ?)`), ev.ID)
		return err
	}
}

// spanOf returns the first of spans named name whose messaging.message.id
// is id.
func spanOf(spans []sdktrace.ReadOnlySpan, name, id string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() != name {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "messaging.message.id" && kv.Value.AsString() == id {
				return s
			}
		}
	}
	return nil
}

// TestTracing: a trace started by a producer shows the outbox relay's
// publish span, and the consumer's span, in a trace of its own, links to
// the producer's span, through a real application with the tracer provider
// it is given, on each transport.
func TestTracing(t *testing.T) {
	t.Parallel()
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			var box *outbox.Outbox
			cfg := tc.config(t)
			// Fresh names: queues on the shared broker outlive the test.
			suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
			consumer := "widgets.traced-" + suffix
			b := setup(t, cfg,
				handlers.Register(consumer, handlers.On(widgetAdded, newStoreTraced)),
				fx.Supply(fx.Annotate(tp, fx.As(new(trace.TracerProvider)))),
				fx.Populate(&box))

			id := "traced-" + suffix
			ctx, producer := tp.Tracer("test").Start(context.Background(), "checkout")
			addWidget(ctx, t, b.db, box, id)
			producer.End()

			var publish, process sdktrace.ReadOnlySpan
			waitFor(t, "the publish and process spans", func() bool {
				ended := spans.Ended()
				publish = spanOf(ended, "publish "+widgetAdded.Type(), id)
				process = spanOf(ended, consumer+" process", id)
				return publish != nil && process != nil
			})
			require.Equal(t, 1, b.count(t, b.db.Rebind(`SELECT count(*) FROM widgets WHERE event_id = ? AND name = 'traced'`), id))

			want := producer.SpanContext()
			require.Equal(t, trace.SpanKindProducer, publish.SpanKind())
			require.Equal(t, want.TraceID(), publish.SpanContext().TraceID(), "the publish span is in the producer's trace")
			require.Equal(t, want.SpanID(), publish.Parent().SpanID(), "a child of the producer's span")
			system := map[string]string{app.TransportSQLite: "sqlite", app.TransportPostgres: "postgresql", app.TransportAMQP: "rabbitmq"}[cfg.Transport]
			require.Contains(t, publish.Attributes(), attribute.String("messaging.system", system))
			require.Contains(t, publish.Attributes(), attribute.String("messaging.destination.name", widgetAdded.Type()))
			require.Equal(t, app.TracerName, publish.InstrumentationScope().Name)

			require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
			require.NotEqual(t, want.TraceID(), process.SpanContext().TraceID(), "a delivery is a trace of its own")
			require.Len(t, process.Links(), 1)
			link := process.Links()[0].SpanContext
			require.Equal(t, want.TraceID(), link.TraceID(), "linked to the producer's span")
			require.Equal(t, want.SpanID(), link.SpanID())
		})
	}
}

// collector is an OTLP/HTTP traces endpoint that records what it is sent.
type collector struct {
	server *httptest.Server

	mu       sync.Mutex
	requests int
	services []string
	spans    map[string]*span // by name
}

// span is what the test reads of an exported span.
type span struct {
	traceID, spanID, parentID string
	links                     []string // span ids
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{spans: map[string]*span{}}
	c.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "not traces", http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.record(&req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.server.Close)
	return c
}

func (c *collector) record(req *collectortrace.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				c.services = append(c.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got := &span{traceID: hexOf(s.GetTraceId()), spanID: hexOf(s.GetSpanId()), parentID: hexOf(s.GetParentSpanId())}
				for _, l := range s.GetLinks() {
					got.links = append(got.links, hexOf(l.GetSpanId()))
				}
				c.spans[s.GetName()] = got
			}
		}
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&0xf])
	}
	return string(out)
}

// runTraced runs an application of cfg's until a widget event added with
// the outbox under a span of the global tracer provider took effect, and
// stops it.
func runTraced(t *testing.T) {
	t.Helper()
	var (
		db  *sqlx.DB
		box *outbox.Outbox
	)
	service := app.New(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
		fx.Replace(testConfig(t)),
		fx.Populate(&db, &box),
	)
	require.NoError(t, service.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, service.Start(ctx))
	producerCtx, producer := otel.Tracer("test").Start(ctx, "checkout")
	addWidget(producerCtx, t, db, box, "w-traced")
	producer.End()
	waitFor(t, "the widget", func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM widgets WHERE event_id = 'w-traced'`))
		return n == 1
	})
	require.NoError(t, service.Stop(ctx))
}

// TestTracingFromEnv: without a tracer provider of its own, the application
// configures OpenTelemetry from the OTEL_* variables: the OTLP exporter to
// the endpoint, the service's name, the global tracer provider (a span of
// otel.Tracer is the producer's) and propagator; the spans still buffered
// are exported when the application stops (the batch delay is an hour).
// Without OTEL_TRACES_EXPORTER, nothing is exported. It sets the
// environment, so it does not run in parallel.
func TestTracingFromEnv(t *testing.T) {
	t.Run("OTLP", func(t *testing.T) {
		c := newCollector(t)
		t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.server.URL)
		t.Setenv("OTEL_SERVICE_NAME", "widgets-traced")
		t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
		runTraced(t)

		c.mu.Lock()
		defer c.mu.Unlock()
		require.NotZero(t, c.requests, "the spans were flushed at stop")
		require.Contains(t, c.services, "widgets-traced")
		producer, publish, process := c.spans["checkout"], c.spans["publish "+widgetAdded.Type()], c.spans[consumerName+" process"]
		require.NotNil(t, producer, "the producer's span, from the global tracer provider")
		require.NotNil(t, publish)
		require.NotNil(t, process)
		require.Equal(t, producer.traceID, publish.traceID)
		require.Equal(t, producer.spanID, publish.parentID)
		require.Equal(t, []string{producer.spanID}, process.links)
		require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())
	})

	t.Run("UnknownExporter", func(t *testing.T) {
		t.Setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
		service := app.New(fx.Replace(testConfig(t)))
		require.ErrorContains(t, service.Err(), "OTEL_TRACES_EXPORTER", "a bad value stops start-up, naming the variable")
	})

	t.Run("OffByDefault", func(t *testing.T) {
		c := newCollector(t)
		t.Setenv("OTEL_TRACES_EXPORTER", "")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.server.URL)
		t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
		runTraced(t)
		c.mu.Lock()
		defer c.mu.Unlock()
		require.Zero(t, c.requests, "no exporter unless OTEL_TRACES_EXPORTER names one")
	})
}
