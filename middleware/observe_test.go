package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
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

	store, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(_ context.Context, ev framework.Event[noteV1]) error {
		if ev.Data.Text == "fail" {
			return framework.Permanent("note_rejected", errors.New("no"))
		}
		return nil
	}))
	require.NoError(t, err)
	h, _, err := middleware.Handler(middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: store,
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
	require.Equal(t, middleware.Report{Outcome: framework.Processed, Attempts: 1}, deliver("hello", "1", producer))
	require.Equal(t, middleware.Report{Outcome: framework.Duplicate, Attempts: 1}, deliver("hello", "1", ""))
	require.Equal(t, middleware.Report{Outcome: framework.DeadLettered, Code: "note_rejected", Attempts: 1}, deliver("fail", "2", ""))
	_, ok := middleware.ReportOf(message.NewMessage("x", nil))
	require.False(t, ok, "a message that went through no chain has no report")
	require.NoError(t, h(message.NewMessage(watermill.NewUUID(), []byte("poison"))))

	count := func(outcome framework.Outcome) float64 {
		return testutil.ToFloat64(metrics.Messages().WithLabelValues(consumerName, string(outcome)))
	}
	require.InDelta(t, 1, count(framework.Processed), 0)
	require.InDelta(t, 1, count(framework.Duplicate), 0)
	require.InDelta(t, 2, count(framework.DeadLettered), 0)
	require.InDelta(t, 1, testutil.ToFloat64(metrics.DeadLetters().WithLabelValues(consumerName, "note_rejected")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(metrics.DeadLetters().WithLabelValues(consumerName, "malformed_envelope")), 0)

	require.Contains(t, logs.String(), "message dead-lettered")
	require.Contains(t, logs.String(), "code=note_rejected")
	require.Contains(t, logs.String(), "correlation_id=corr-1")
	require.Contains(t, logs.String(), `code=note_rejected error_type=*errors.errorString`, "a dead letter is logged with the type of the handler's error, not its text (LogErrorText)")
	require.NotContains(t, logs.String(), `permanent (note_rejected): no`)

	ended := spans.Ended()
	require.Len(t, ended, 4)
	require.Len(t, ended[0].Links(), 1, "the consumer span links to the producer's")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", ended[0].Links()[0].SpanContext.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", ended[0].Links()[0].SpanContext.SpanID().String())
	require.NotEqual(t, "4bf92f3577b34da6a3ce929d0e0e4736", ended[0].SpanContext().TraceID().String(), "a trace of its own")
	attrs := map[string]string{}
	for _, kv := range ended[0].Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsString()
	}
	require.Equal(t, "process", attrs["messaging.operation.type"])
	require.Equal(t, "process", attrs["messaging.operation.name"])
	require.Equal(t, consumerName, attrs["messaging.consumer.group.name"])
	require.Equal(t, "1", attrs["messaging.message.id"])
	require.Equal(t, "corr-1", attrs["messaging.message.conversation_id"], "the correlation id")
}

// failingBundle is a consumer's whole chain on a real SQLite store, with
// an Observe step on a clock of the test's.
type failingBundle struct {
	reg     *prometheus.Registry
	metrics *middleware.Metrics
	store   *sqlite.Store
	handler message.NoPublishHandlerFunc
	now     time.Time

	mu       sync.Mutex
	refuse   map[string]bool // ids an Outer step nacks on every delivery
	fail     map[string]bool // ids the handler fails on every attempt
	full     map[string]int  // ids the handler fails with disk_full, on so many attempts
	duringEv func()          // runs in the handler's last attempt, if set
}

// setupFailing builds the chain: two attempts, three deliveries, an Outer
// step that nacks the ids of refuse, a handler that fails on the ids of
// fail. Failing messages stay counted for a minute without failing again,
// and may keep failing for 12 s before they count as held up.
func setupFailing(t *testing.T) *failingBundle {
	t.Helper()
	fb := &failingBundle{
		reg:    prometheus.NewRegistry(),
		now:    time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		refuse: make(map[string]bool),
		fail:   make(map[string]bool),
		full:   make(map[string]int),
	}
	var err error
	fb.metrics, err = middleware.NewMetrics(fb.reg)
	require.NoError(t, err)
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	fb.store, err = sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: fb.store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(_ context.Context, ev framework.Event[noteV1]) error {
		fb.mu.Lock()
		failing, during, full := fb.fail[ev.ID], fb.duringEv, fb.full[ev.ID]
		fb.full[ev.ID]--
		fb.mu.Unlock()
		if during != nil {
			during()
		}
		switch {
		case failing:
			return errors.New("dependency down")
		case full > 0:
			return fmt.Errorf("insert: %w", &pgconn.PgError{Code: "53100", Message: "could not extend file"})
		}
		return nil
	}))
	require.NoError(t, err)
	refuse := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, _ := framework.EnvelopeFromContext(msg.Context())
			fb.mu.Lock()
			refused := fb.refuse[d.Key().ID]
			fb.mu.Unlock()
			if refused {
				return nil, errors.New("not now")
			}
			return next(msg)
		}
	}
	// The chain on the test's clock, with a hold-up limit of its own.
	fb.handler, err = middleware.HandlerOnClock(middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: fb.store,
		Settings: middleware.Settings{
			MaxDeliveries: 3,
			Attempts:      2,
			RetryDelay:    time.Millisecond,
		},
		Metrics: fb.metrics,
		Outer:   []message.HandlerMiddleware{refuse},
	}, middleware.TestClock{
		Now:         func() time.Time { fb.mu.Lock(); defer fb.mu.Unlock(); return fb.now },
		HoldUpLimit: 12 * time.Second, ForgetFailingAfter: time.Minute,
	})
	require.NoError(t, err)
	return fb
}

func (fb *failingBundle) set(f func()) { fb.mu.Lock(); defer fb.mu.Unlock(); f() }

func (fb *failingBundle) advance(d time.Duration) { fb.set(func() { fb.now = fb.now.Add(d) }) }

// deliver hands a new copy of event id to the chain in ctx and returns
// its report.
func (fb *failingBundle) deliver(ctx context.Context, t *testing.T, id string) middleware.Report {
	t.Helper()
	env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{ID: id, Source: "notes"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	msg.SetContext(ctx)
	_ = fb.handler(msg)
	rep, ok := middleware.ReportOf(msg)
	require.True(t, ok)
	return rep
}

// status returns the consumer's status, and checks that the gauges served
// to Prometheus say the same.
func (fb *failingBundle) status(t *testing.T) middleware.ConsumerStatus {
	t.Helper()
	statuses := fb.metrics.Consumers()
	require.Len(t, statuses, 1)
	s := statuses[0]
	require.Equal(t, consumerName, s.Consumer)
	families, err := fb.reg.Gather()
	require.NoError(t, err)
	gauges := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "effectively_consumer_") {
			continue
		}
		if f.GetName() == "effectively_consumer_paused_messages" { // by consumer and reason
			var paused float64
			for _, m := range f.GetMetric() {
				paused += m.GetGauge().GetValue()
			}
			require.Len(t, f.GetMetric(), 2)
			require.InDelta(t, float64(s.PausedMessages), paused, 0)
			continue
		}
		require.Len(t, f.GetMetric(), 1, f.GetName())
		m := f.GetMetric()[0]
		require.Equal(t, "consumer", m.GetLabel()[0].GetName(), "labelled by consumer alone")
		require.Len(t, m.GetLabel(), 1, "labelled by consumer alone")
		gauges[f.GetName()] = m.GetGauge().GetValue()
	}
	require.Equal(t, map[string]float64{
		"effectively_consumer_failing_messages":       float64(s.FailingMessages),
		"effectively_consumer_oldest_failing_seconds": s.OldestFailing.Seconds(),
		"effectively_consumer_hold_up_limit_seconds":  12,
	}, gauges)
	return s
}

func TestObserveFailing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	none := func(t *testing.T, fb *failingBundle) {
		t.Helper()
		require.Equal(t, middleware.ConsumerStatus{Consumer: consumerName, HoldUpLimit: 12 * time.Second}, fb.status(t))
	}

	t.Run("NackedUntilDeadLettered", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		none(t, fb)
		fb.set(func() { fb.refuse["1"] = true })
		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "1").Outcome)
		fb.advance(10 * time.Second)
		s := fb.status(t)
		require.Equal(t, 1, s.FailingMessages)
		require.Equal(t, 10*time.Second, s.OldestFailing)
		require.False(t, s.HeldUp())

		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "1").Outcome)
		fb.advance(5 * time.Second)
		s = fb.status(t)
		require.Equal(t, 1, s.FailingMessages, "one message, delivered twice")
		require.Equal(t, 15*time.Second, s.OldestFailing, "since its first failure")
		require.True(t, s.HeldUp(), "failing for longer than the hold-up limit")

		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "1").Outcome)
		rep := fb.deliver(ctx, t, "1")
		require.Equal(t, framework.DeadLettered, rep.Outcome)
		require.Equal(t, framework.CodeDeliveryLimit, rep.Code)
		none(t, fb)
	})

	t.Run("AttemptsFailUntilDeadLettered", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		var during []middleware.ConsumerStatus
		fb.set(func() {
			fb.fail["1"] = true
			fb.duringEv = func() { during = append(during, fb.metrics.Consumers()...) }
		})
		rep := fb.deliver(ctx, t, "1")
		require.Equal(t, framework.DeadLettered, rep.Outcome)
		require.Equal(t, framework.CodeRetriesExhausted, rep.Code)
		require.Len(t, during, 2)
		require.Equal(t, 0, during[0].FailingMessages, "first attempt")
		require.Equal(t, 1, during[1].FailingMessages, "second attempt, after the first failed")
		none(t, fb)
	})

	t.Run("DatabaseFullPauses", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		var during []middleware.ConsumerStatus
		fb.set(func() {
			fb.full["1"] = 2 // more than its 2 attempts, were they charged
			fb.duringEv = func() { during = append(during, fb.metrics.Consumers()...) }
		})
		rep := fb.deliver(ctx, t, "1")
		require.Equal(t, framework.Processed, rep.Outcome, "the full disk's attempts were not charged")
		require.Len(t, during, 3)
		require.Equal(t, "", during[0].Paused, "first attempt")
		for _, s := range during[1:] {
			require.Equal(t, 1, s.FailingMessages)
			require.Equal(t, middleware.PausedDatabaseFull, s.Paused, "paused between the attempts")
		}
		none(t, fb)
	})

	t.Run("FailsThenSucceeds", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		fb.set(func() { fb.refuse["1"], fb.refuse["2"] = true, true })
		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "1").Outcome)
		fb.advance(time.Second)
		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "2").Outcome)
		fb.advance(time.Second)
		s := fb.status(t)
		require.Equal(t, 2, s.FailingMessages)
		require.Equal(t, 2*time.Second, s.OldestFailing)

		fb.set(func() { fb.refuse["1"] = false })
		require.Equal(t, framework.Processed, fb.deliver(ctx, t, "1").Outcome)
		s = fb.status(t)
		require.Equal(t, 1, s.FailingMessages)
		require.Equal(t, time.Second, s.OldestFailing, "the oldest left")

		require.Equal(t, framework.Duplicate, fb.deliver(ctx, t, "1").Outcome)
		fb.set(func() { fb.refuse["2"] = false })
		require.Equal(t, framework.Processed, fb.deliver(ctx, t, "2").Outcome)
		none(t, fb)
	})

	t.Run("ForgottenWhenItFailsNoMore", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		fb.set(func() { fb.refuse["1"] = true })
		require.Equal(t, framework.Nacked, fb.deliver(ctx, t, "1").Outcome)
		fb.advance(time.Minute)
		require.Equal(t, 1, fb.status(t).FailingMessages, "failed a minute ago: still counted")
		fb.advance(time.Second)
		none(t, fb) // it went to another process, which handled it
	})

	t.Run("ShutdownIsNoFailure", func(t *testing.T) {
		t.Parallel()
		fb := setupFailing(t)
		stopped, cancel := context.WithCancel(ctx)
		cancel()
		require.Equal(t, framework.Nacked, fb.deliver(stopped, t, "1").Outcome)
		none(t, fb)
	})

	t.Run("ChainSetsTheHoldUpLimit", func(t *testing.T) {
		t.Parallel()
		metrics, err := middleware.NewMetrics(prometheus.NewRegistry())
		require.NoError(t, err)
		store, err := memory.NewStore(memory.StoreConfig{})
		require.NoError(t, err)
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
		require.NoError(t, err)
		c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error { return nil }))
		require.NoError(t, err)
		_, _, err = middleware.Handler(middleware.Config{
			Consumer: c, UnitOfWork: uow, Store: store, Metrics: metrics,
			Settings: middleware.Settings{
				MaxDeliveries: 4,
				Attempts:      3,
				RetryDelay:    2 * time.Second,
				Timeout:       8 * time.Second,
			},
		})
		require.NoError(t, err)
		require.Equal(t, []middleware.ConsumerStatus{{Consumer: consumerName, HoldUpLimit: 4 * 3 * 10 * time.Second}}, metrics.Consumers(),
			"a consumer shows, none failing, once its chain is built")
	})
}

// TestObserveEventAge: an event processed is observed in
// effectively_event_age_seconds from its CloudEvent time; a duplicate
// is not.
func TestObserveEventAge(t *testing.T) {
	t.Parallel()
	h, reg := eventAgeChain(t)
	deliver := func(id string, at time.Time) {
		env, err := noted.Envelope(noteV1{Text: "hi"}, framework.Attributes{ID: id, Source: "notes", Time: at})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, h(msg))
	}
	deliver("1", time.Now().Add(-time.Hour))
	deliver("1", time.Now().Add(-time.Hour)) // a duplicate

	count, sum := eventAge(t, reg)
	require.Equal(t, uint64(1), count)
	require.InDelta(t, 3600, sum, 60)
}

// TestObserveEventAgeFromPublishedAt: an event processed without a
// CloudEvent time is observed in effectively_event_age_seconds from when
// its transport says it was published (framework.MetadataPublishedAt);
// one with neither, or with a time that does not parse, is not.
func TestObserveEventAgeFromPublishedAt(t *testing.T) {
	t.Parallel()
	h, reg := eventAgeChain(t)
	deliver := func(id, publishedAt string) {
		env, err := noted.Envelope(noteV1{Text: "hi"}, framework.Attributes{ID: id, Source: "notes"})
		require.NoError(t, err)
		env.Time = time.Time{} // a producer that sends no time
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NotContains(t, string(msg.Payload), `"time"`)
		if publishedAt != "" {
			msg.Metadata.Set(framework.MetadataPublishedAt, publishedAt)
		}
		require.NoError(t, h(msg))
	}
	deliver("1", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano))
	deliver("2", "")
	deliver("3", "an hour ago")

	count, sum := eventAge(t, reg)
	require.Equal(t, uint64(1), count, "the event with a publishing time only")
	require.InDelta(t, 3600, sum, 60)
}

// eventAgeChain returns a chain on the memory store whose handler takes
// every event, with its metrics in the registry returned.
func eventAgeChain(t *testing.T) (message.NoPublishHandlerFunc, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	metrics, err := middleware.NewMetrics(reg)
	require.NoError(t, err)
	store, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error { return nil }))
	require.NoError(t, err)
	h, _, err := middleware.Handler(middleware.Config{Consumer: c, UnitOfWork: uow, Store: store, Metrics: metrics})
	require.NoError(t, err)
	return h, reg
}

// eventAge returns the sample count and sum of the one series of
// effectively_event_age_seconds in reg.
func eventAge(t *testing.T, reg *prometheus.Registry) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "effectively_event_age_seconds" {
			require.Len(t, mf.GetMetric(), 1)
			hist := mf.GetMetric()[0].GetHistogram()
			return hist.GetSampleCount(), hist.GetSampleSum()
		}
	}
	t.Fatal("effectively_event_age_seconds not scraped")
	return 0, 0
}
