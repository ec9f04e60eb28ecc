package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/middleware"
)

func TestObserve(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	metrics, err := middleware.NewMetrics(reg)
	require.NoError(t, err)
	var logs bytes.Buffer
	spans := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	store := memory.NewStore()
	uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{Processed: store, Deliveries: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(_ context.Context, ev framework.Event[noteV1]) error {
		if ev.Data.Text == "fail" {
			return framework.Permanent("note_rejected", errors.New("no"))
		}
		return nil
	}))
	require.NoError(t, err)
	h, err := middleware.Handler(middleware.ChainConfig{
		Consumer: c, UnitOfWork: uow, DeadLetters: store, Deliveries: store,
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: metrics,
		Tracer:  tp.Tracer("test"),
	})
	require.NoError(t, err)

	deliver := func(text, id, traceparent string) middleware.Report {
		env, err := noted.Envelope(noteV1{Text: text}, framework.Attributes{ID: id, Source: "notes", TraceParent: traceparent, CorrelationID: "corr-1"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, h(msg))
		rep, ok := middleware.ReportOf(msg)
		require.True(t, ok)
		return rep
	}
	producer := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.Equal(t, middleware.Report{Outcome: middleware.OutcomeProcessed, Attempts: 1}, deliver("hello", "1", producer))
	require.Equal(t, middleware.Report{Outcome: middleware.OutcomeDuplicate, Attempts: 1}, deliver("hello", "1", ""))
	require.Equal(t, middleware.Report{Outcome: middleware.OutcomeDeadLettered, Code: "note_rejected", Attempts: 1}, deliver("fail", "2", ""))
	_, ok := middleware.ReportOf(message.NewMessage("x", nil))
	require.False(t, ok, "a message that went through no chain has no report")
	require.NoError(t, h(message.NewMessage(watermill.NewUUID(), []byte("poison"))))

	count := func(outcome string) float64 {
		return testutil.ToFloat64(metrics.Messages().WithLabelValues(consumerName, outcome))
	}
	require.InDelta(t, 1, count(middleware.OutcomeProcessed), 0)
	require.InDelta(t, 1, count(middleware.OutcomeDuplicate), 0)
	require.InDelta(t, 2, count(middleware.OutcomeDeadLettered), 0)
	require.InDelta(t, 1, testutil.ToFloat64(metrics.DeadLetters().WithLabelValues(consumerName, "note_rejected")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(metrics.DeadLetters().WithLabelValues(consumerName, "malformed_envelope")), 0)

	require.Contains(t, logs.String(), "message dead-lettered")
	require.Contains(t, logs.String(), "code=note_rejected")
	require.Contains(t, logs.String(), "correlation_id=corr-1")
	require.Contains(t, logs.String(), `error="permanent (note_rejected): no"`, "a dead letter is logged with the handler's error")

	ended := spans.Ended()
	require.Len(t, ended, 4)
	require.Len(t, ended[0].Links(), 1, "the consumer span links to the producer's")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", ended[0].Links()[0].SpanContext.TraceID().String())
}
