package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/testenv"
)

// tracing is an in-memory tracer provider and what it recorded.
type tracing struct {
	spans *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
}

func newTracing(t *testing.T) *tracing {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{spans: spans, tp: tp}
}

// publishSpans returns the ended spans named publish typ.
func (tr *tracing) publishSpans(typ string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.spans.Ended() {
		if s.Name() == "publish "+typ {
			out = append(out, s)
		}
	}
	return out
}

// attrs returns the attributes of s by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.AsString()
	}
	return m
}

// mustText returns the text of a noted event.
func mustText(t *testing.T, env framework.Envelope) string {
	t.Helper()
	var data noteV1
	require.NoError(t, json.Unmarshal(env.Data, &data))
	return data.Text
}

// decodeAll decodes the messages the recorder took.
func decodeAll(t *testing.T, pub *recorder) map[string]framework.Envelope {
	t.Helper()
	out := map[string]framework.Envelope{}
	for _, p := range pub.all() {
		env, err := driver.DecodeMessage(p.msg, framework.DefaultMaxBodyBytes)
		require.NoError(t, err)
		out[env.ID] = env
	}
	return out
}

// TestTraceContext: Add stamps the creation context (the span of the
// producer's ctx) into an event that has none, and the relay publishes
// each row in a producer span of its own, a child of that context, with
// the messaging attributes.
func TestTraceContext(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testTraceContext(t, b)
		})
	}
}

func testTraceContext(t *testing.T, b backend) {
	ctx := context.Background()

	t.Run("AddStampsTheProducersSpan", func(t *testing.T) {
		t.Parallel()
		bd, tr := setup(t, b), newTracing(t)
		pctx, producer := tr.tp.Tracer("test").Start(ctx, "book appointment")
		envs := []framework.Envelope{env(t, "e-1"), env(t, "e-2")}
		_, err := bd.uow.Do(pctx, "notes.producer", framework.Key{Source: "in", ID: "in-1"}, func(ctx context.Context) error {
			return bd.box.Add(ctx, envs...)
		})
		require.NoError(t, err)
		producer.End()
		require.Empty(t, envs[0].TraceParent, "the caller's envelopes are left as they were")

		_, err = bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		got := decodeAll(t, bd.pub)
		require.Len(t, got, 2)
		sc := producer.SpanContext()
		want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
		require.Equal(t, want, got["e-1"].TraceParent)
		require.Equal(t, want, got["e-2"].TraceParent)
	})

	t.Run("AddTxStampsTheProducersSpan", func(t *testing.T) {
		t.Parallel()
		bd, tr := setup(t, b), newTracing(t)
		state, err := trace.ParseTraceState("vendor=opaque")
		require.NoError(t, err)
		pctx, producer := tr.tp.Tracer("test").Start(ctx, "request")
		// A tracestate travels with the traceparent.
		pctx = trace.ContextWithSpanContext(pctx, producer.SpanContext().WithTraceState(state))
		tx, err := bd.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, bd.box.AddTx(pctx, tx, env(t, "e-1")))
		require.NoError(t, tx.Commit())
		producer.End()
		_, err = bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		got := decodeAll(t, bd.pub)["e-1"]
		require.Contains(t, got.TraceParent, producer.SpanContext().SpanID().String())
		require.Equal(t, "vendor=opaque", got.TraceState)
	})

	t.Run("ProducersTraceParentIsKept", func(t *testing.T) {
		t.Parallel()
		bd, tr := setup(t, b), newTracing(t)
		_, producer := tr.tp.Tracer("test").Start(ctx, "request")
		defer producer.End()
		own := env(t, "e-1")
		own.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(trace.ContextWithSpan(ctx, producer), own)
		}))
		_, err := bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, own.TraceParent, decodeAll(t, bd.pub)["e-1"].TraceParent)
	})

	t.Run("NoSpanNoTraceParent", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error { return bd.box.Add(ctx, env(t, "e-1")) }))
		_, err := bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		require.Empty(t, decodeAll(t, bd.pub)["e-1"].TraceParent)
	})

	t.Run("PublishSpanPerRow", func(t *testing.T) {
		t.Parallel()
		bd, tr := setup(t, b), newTracing(t)
		pctx, producer := tr.tp.Tracer("test").Start(ctx, "request")
		tx, err := bd.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, bd.box.AddTx(pctx, tx, env(t, "e-1")))
		require.NoError(t, bd.box.AddTx(ctx, tx, env(t, "e-2"))) // no creation context
		require.NoError(t, tx.Commit())
		producer.End()

		relay := bd.relay(t, outbox.RelayConfig{Tracer: tr.tp.Tracer("relay"), MessagingSystem: "sqlite"})
		n, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		spans := tr.publishSpans(noted.Type())
		require.Len(t, spans, 2, "a span per publish")
		byID := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range spans {
			require.Equal(t, trace.SpanKindProducer, s.SpanKind())
			require.Equal(t, codes.Unset, s.Status().Code)
			byID[attrs(s)["messaging.message.id"]] = s
		}
		first := byID["e-1"]
		require.NotNil(t, first)
		require.Equal(t, map[attribute.Key]string{
			"messaging.system":           "sqlite",
			"messaging.operation.type":   "send",
			"messaging.operation.name":   "publish",
			"messaging.destination.name": noted.Type(),
			"messaging.message.id":       "e-1",
			"cloudevents.event_source":   "notes",
		}, attrs(first))
		require.Equal(t, producer.SpanContext().TraceID(), first.SpanContext().TraceID(), "in the producer's trace")
		require.Equal(t, producer.SpanContext().SpanID(), first.Parent().SpanID(), "a child of the creation context")
		require.True(t, first.Parent().IsRemote())

		second := byID["e-2"]
		require.NotNil(t, second)
		require.False(t, second.Parent().IsValid(), "an event without a creation context is published in a trace of its own")
		require.NotEqual(t, producer.SpanContext().TraceID(), second.SpanContext().TraceID())

		got := decodeAll(t, bd.pub)
		sc := producer.SpanContext()
		require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", got["e-1"].TraceParent, "a creation context is left as it is")
		sc = second.SpanContext()
		require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", got["e-2"].TraceParent,
			"an event without one gets the publish span's context")
		require.Equal(t, "text of e-2", mustText(t, got["e-2"]), "and is the same event otherwise")
	})

	t.Run("FailedPublishSpan", func(t *testing.T) {
		t.Parallel()
		bd, tr := setup(t, b), newTracing(t)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error { return bd.box.Add(ctx, env(t, "e-1")) }))
		bd.pub.fail = func(int, *message.Message) error { return errors.New("broker away") }
		_, err := bd.relay(t, outbox.RelayConfig{Tracer: tr.tp.Tracer("relay")}).PublishUnsent(ctx)
		require.ErrorContains(t, err, "broker away")
		spans := tr.publishSpans(noted.Type())
		require.Len(t, spans, 1)
		require.Equal(t, codes.Error, spans[0].Status().Code)
		require.Equal(t, "_OTHER", attrs(spans[0])["error.type"])
		require.NotContains(t, attrs(spans[0]), attribute.Key("messaging.system"), "no system unless the config names it")
	})
}

// TestTraceContextAMQP: over the AMQP transport's pipelined publisher, each
// row's publish span is a child of its creation context and ends with the
// broker's confirm; a nacked row's span ends in error.
func TestTraceContextAMQP(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	ctx := context.Background()
	bd, tr := setup(t, backends[0]), newTracing(t)
	id := suffix()
	okType, rejType := "outbox.test.traced."+id, "outbox.test.traced-rejected."+id
	okEv, rejEv := framework.Define[otherV1](okType, 1), framework.Define[otherV1](rejType, 1)
	br := dialBroker(t, url)
	okQ := br.queue(t, okType, false, nil)
	br.queue(t, rejType, false, map[string]any{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	okEnv, err := okEv.Envelope(otherV1{N: 1}, framework.Attributes{ID: "e-ok", Source: "notes"})
	require.NoError(t, err)
	rejEnv, err := rejEv.Envelope(otherV1{N: 2}, framework.Attributes{ID: "e-rejected", Source: "notes"})
	require.NoError(t, err)
	pctx, producer := tr.tp.Tracer("test").Start(ctx, "request")
	_, err = bd.uow.Do(pctx, "notes.producer", framework.Key{Source: "in", ID: "in-1"}, func(ctx context.Context) error {
		return bd.box.Add(ctx, okEnv, rejEnv)
	})
	require.NoError(t, err)
	producer.End()

	relay, err := outbox.NewRelay(bd.db, transport(t, url).Publisher(), outbox.RelayConfig{Tracer: tr.tp.Tracer("relay"), MessagingSystem: "rabbitmq"})
	require.NoError(t, err)
	n, err := relay.PublishUnsent(ctx)
	require.Error(t, err, "the rejecting queue nacks its row")
	require.Equal(t, 1, n)
	require.Len(t, br.drain(t, okQ), 1)

	ok, rejected := tr.publishSpans(okType), tr.publishSpans(rejType)
	require.Len(t, ok, 1)
	require.Len(t, rejected, 1)
	for _, s := range []sdktrace.ReadOnlySpan{ok[0], rejected[0]} {
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, producer.SpanContext().SpanID(), s.Parent().SpanID())
		require.Equal(t, "rabbitmq", attrs(s)["messaging.system"])
	}
	require.Equal(t, codes.Unset, ok[0].Status().Code)
	require.Equal(t, codes.Error, rejected[0].Status().Code, "the nacked row's span ends in error")
}
