package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// What a user's service would hold: an event contract, a table of its own
// created by its own migration, and a handler that writes to it.

type BookedV1 struct {
	AppointmentID string `json:"appointmentId" validate:"required"`
	StartsAt      string `json:"startsAt" validate:"required"`
}

var Booked = framework.Define[BookedV1]("appointments.appointment.booked", 1)

var migrations = fstest.MapFS{"00001_reminders.sql": {Data: []byte(`-- +goose Up
CREATE TABLE reminders (appointment_id TEXT PRIMARY KEY, starts_at TEXT NOT NULL);
-- +goose Down
DROP TABLE reminders;
`)}}

// Reminders schedules a reminder per booked appointment.
type Reminders struct {
	db *sqlx.DB
	// fail, when set, decides the handler's error on each call (1, 2...).
	fail  func(ctx context.Context, call int64) error
	calls atomic.Int64
}

func (r *Reminders) Handle(ctx context.Context, ev framework.Event[BookedV1]) error {
	call := r.calls.Add(1)
	_, err := framework.Conn(ctx, r.db).ExecContext(ctx,
		r.db.Rebind(`INSERT INTO reminders (appointment_id, starts_at) VALUES (?, ?)`),
		ev.Data.AppointmentID, ev.Data.StartsAt)
	if err != nil {
		return fmt.Errorf("schedule reminder: %w", err)
	}
	if r.fail != nil {
		return r.fail(ctx, call)
	}
	return nil
}

const consumerName = "notifications.remind-on-appointment-booked"

func reminders(t *testing.T, kit *testkit.Kit) int {
	t.Helper()
	var n int
	require.NoError(t, kit.DB().Get(&n, `SELECT count(*) FROM reminders`))
	return n
}

// bundle is one test's kit, handler and consumer.
type bundle struct {
	kit      *testkit.Kit
	handler  *Reminders
	consumer *testkit.Chain
}

func setup(t *testing.T, cfg testkit.Config) *bundle {
	t.Helper()
	cfg.Migrations = migrations
	kit := testkit.New(t, cfg)
	h := &Reminders{db: kit.DB()}
	return &bundle{kit: kit, handler: h, consumer: kit.Chain(t, consumerName, framework.Handle(Booked, h.Handle))}
}

func booked(t *testing.T, id string) framework.Envelope {
	t.Helper()
	return testkit.Envelope(t, Booked, BookedV1{AppointmentID: "a-" + id, StartsAt: "2030-01-01T09:00:00Z"}, framework.Attributes{ID: id, Source: "appointments"})
}

// backends runs test on SQLite, and on PostgreSQL when
// EFFECTIVELY_TEST_POSTGRES_URL names a server (under CI=true it must).
func backends(t *testing.T, test func(t *testing.T, base testkit.Config)) {
	t.Helper()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		test(t, testkit.Config{})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		test(t, testkit.Config{PostgresURL: postgresURL(t)})
	})
}

func postgresURL(t *testing.T) string {
	t.Helper()
	return testenv.Require(t, testenv.PostgresURLVar)
}

// TestShowcase is the typical test of a handler: two deliveries of one
// event have one effect, and poison is dead-lettered with its code.
func TestShowcase(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		ctx := t.Context()
		kit := testkit.New(t, testkit.Config{PostgresURL: base.PostgresURL, Migrations: migrations})
		h := &Reminders{db: kit.DB()}
		c := kit.Chain(t, consumerName, framework.Handle(Booked, h.Handle))

		env := testkit.Envelope(t, Booked, BookedV1{AppointmentID: "a-1", StartsAt: "2030-01-01T09:00:00Z"}, framework.Attributes{})
		testkit.RequireProcessed(t, c.Deliver(ctx, t, env))
		testkit.RequireDuplicate(t, c.Deliver(ctx, t, env))
		require.Equal(t, 1, reminders(t, kit))

		testkit.RequireDeadLettered(t, c.DeliverBody(ctx, t, []byte("not an event")), framework.CodeMalformedEnvelope)
		dls := kit.DeadLetters(ctx, t)
		require.Len(t, dls, 1)
		require.Equal(t, consumerName, dls[0].Consumer)
	})
}

func TestDeliver(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		t.Run("InvalidPayload", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			env := booked(t, "1")
			env.Data = []byte(`{"appointmentId": ""}`)
			res := bd.consumer.Deliver(t.Context(), t, env)
			testkit.RequireDeadLettered(t, res, framework.CodeInvalidPayload)
			require.Zero(t, res.Attempts, "poison never reaches the handler")
			require.Zero(t, bd.handler.calls.Load())
		})

		t.Run("UnknownType", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			env := booked(t, "1")
			env.Type = "appointments.appointment.cancelled"
			testkit.RequireDeadLettered(t, bd.consumer.Deliver(t.Context(), t, env), framework.CodeUnknownType)
		})

		t.Run("FlakyThenProcessed", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			bd.handler.fail = func(_ context.Context, call int64) error {
				if call == 1 {
					return errors.New("flaky")
				}
				return nil
			}
			res := bd.consumer.Deliver(t.Context(), t, booked(t, "1"))
			testkit.RequireProcessed(t, res)
			require.Equal(t, 2, res.Attempts)
			require.Equal(t, 1, reminders(t, bd.kit), "the failed attempt rolled back its write")
		})

		// The kit's Config holds the consumer's whole settings, the
		// breaker included: once open, a message waits at it, uncounted,
		// and is nacked after max_hold, its handler not called.
		t.Run("BreakerOpens", func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Attempts = 1
			cfg.Breaker = middleware.BreakerConfig{Failures: 1, AnyError: true, CoolDown: time.Hour, MaxHold: 20 * time.Millisecond}
			bd := setup(t, cfg)
			bd.handler.fail = func(context.Context, int64) error { return errors.New("down") }
			res := bd.consumer.Deliver(t.Context(), t, booked(t, "1"))
			require.Equal(t, framework.Nacked, res.Outcome, "the failure opens the breaker: %v", res)
			require.ErrorContains(t, res.Err, "circuit breaker open")
			bd.handler.fail = nil
			res = bd.consumer.Deliver(t.Context(), t, booked(t, "2"))
			require.Equal(t, framework.Nacked, res.Outcome, "held at the open breaker, then released: %v", res)
			require.Zero(t, res.Attempts)
			require.EqualValues(t, 1, bd.handler.calls.Load(), "the held message never reached the handler")
		})

		t.Run("RetriesExhausted", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			bd.handler.fail = func(context.Context, int64) error { return errors.New("down") }
			res := bd.consumer.Deliver(t.Context(), t, booked(t, "1"))
			testkit.RequireDeadLettered(t, res, framework.CodeRetriesExhausted)
			require.Equal(t, testkit.DefaultAttempts, res.Attempts)
			require.Zero(t, reminders(t, bd.kit))
			dls := bd.consumer.DeadLetters(t.Context(), t)
			require.Len(t, dls, 1)
			require.Equal(t, testkit.DefaultAttempts, dls[0].Attempts)
		})

		t.Run("PermanentWithOwnCode", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			bd.handler.fail = func(context.Context, int64) error {
				return framework.Permanent("appointment_unknown", errors.New("no such appointment"))
			}
			res := bd.consumer.Deliver(t.Context(), t, booked(t, "1"))
			testkit.RequireDeadLettered(t, res, "appointment_unknown")
			require.Equal(t, 1, res.Attempts, "a permanent error is not retried")
			require.True(t, res.Acked())
		})

		t.Run("Panic", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			bd.handler.fail = func(context.Context, int64) error { panic("boom") }
			testkit.RequireDeadLettered(t, bd.consumer.Deliver(t.Context(), t, booked(t, "1")), framework.CodePanic)
		})

		t.Run("Timeout", func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Attempts, cfg.Timeout = 2, 20*time.Millisecond
			bd := setup(t, cfg)
			bd.handler.fail = func(ctx context.Context, _ int64) error {
				<-ctx.Done()
				return ctx.Err()
			}
			res := bd.consumer.Deliver(t.Context(), t, booked(t, "1"))
			testkit.RequireDeadLettered(t, res, framework.CodeTimeout)
			require.Equal(t, 2, res.Attempts)
		})

		t.Run("DuplicateStorm", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			// More copies than the delivery limit (10): still one effect,
			// and the rest are duplicates, not dead letters.
			rs := bd.consumer.DeliverConcurrently(t.Context(), t, booked(t, "1"), 24)
			require.Len(t, rs, 24)
			require.Equal(t, 1, rs.Count(framework.Processed), "%v", rs)
			require.Equal(t, 23, rs.Count(framework.Duplicate), "%v", rs)
			require.Equal(t, 1, reminders(t, bd.kit))
			require.EqualValues(t, 1, bd.handler.calls.Load())
		})

		t.Run("ShutdownNacks", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			ctx, cancel := context.WithCancel(t.Context())
			bd.handler.fail = func(hctx context.Context, call int64) error {
				if call == 1 {
					cancel() // the app shuts down mid-attempt
					<-hctx.Done()
					return hctx.Err()
				}
				return nil
			}
			res := bd.consumer.Deliver(ctx, t, booked(t, "1"))
			testkit.RequireNacked(t, res)
			require.False(t, res.Acked())
			require.ErrorIs(t, res.Err, context.Canceled)
			require.Empty(t, bd.kit.DeadLetters(t.Context(), t), "shutdown never dead-letters")
			require.Zero(t, reminders(t, bd.kit))

			testkit.RequireProcessed(t, bd.consumer.Deliver(t.Context(), t, booked(t, "1")))
			require.Equal(t, 1, reminders(t, bd.kit))
		})

		t.Run("DeliveryLimit", func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.MaxDeliveries = 2
			bd := setup(t, cfg)
			// Every delivery dies mid-attempt, as if it killed the process.
			env := booked(t, "1")
			for range cfg.MaxDeliveries {
				ctx, cancel := context.WithCancel(t.Context())
				bd.handler.fail = func(hctx context.Context, _ int64) error {
					cancel()
					<-hctx.Done()
					return hctx.Err()
				}
				testkit.RequireNacked(t, bd.consumer.Deliver(ctx, t, env))
				cancel()
			}
			res := bd.consumer.Deliver(t.Context(), t, env)
			testkit.RequireDeadLettered(t, res, framework.CodeDeliveryLimit)
			require.Zero(t, res.Attempts)
			require.EqualValues(t, 2, bd.handler.calls.Load())
		})

		t.Run("Stale", func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.SkipStale = true
			bd := setup(t, cfg)
			event := func(id string, seq int64) framework.Envelope {
				return testkit.Envelope(t, Booked, BookedV1{AppointmentID: id, StartsAt: "2030-01-01T09:00:00Z"},
					framework.Attributes{ID: id, Subject: "appointment-1", SubjectSeq: seq})
			}
			testkit.RequireProcessed(t, bd.consumer.Deliver(t.Context(), t, event("second", 2)))
			testkit.RequireStale(t, bd.consumer.Deliver(t.Context(), t, event("first", 1)))
			require.Equal(t, 1, reminders(t, bd.kit))
		})

		t.Run("Replay", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			var fixed atomic.Bool
			bd.handler.fail = func(context.Context, int64) error {
				if !fixed.Load() {
					return framework.Permanent("calendar_unavailable", nil)
				}
				return nil
			}
			testkit.RequireDeadLettered(t, bd.consumer.Deliver(t.Context(), t, booked(t, "1")), "calendar_unavailable")
			fixed.Store(true)
			dls := bd.consumer.DeadLetters(t.Context(), t)
			require.Len(t, dls, 1)
			testkit.RequireProcessed(t, bd.consumer.Replay(t.Context(), t, dls[0]))
			require.Equal(t, 1, reminders(t, bd.kit))
			dls = bd.consumer.DeadLetters(t.Context(), t)
			require.Len(t, dls, 1)
			require.Equal(t, driver.DeadLetterReplayed, dls[0].Status)
			rs, err := bd.kit.Store().ClaimReplays(t.Context(), 10, time.Minute)
			require.NoError(t, err)
			require.Empty(t, rs, "the replay is recorded sent, as the service's relay would")
		})

		t.Run("TablePrefix", func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.TablePrefix = "fx_"
			bd := setup(t, cfg)
			testkit.RequireProcessed(t, bd.consumer.Deliver(t.Context(), t, booked(t, "1")))
			var n int
			require.NoError(t, bd.kit.DB().Get(&n, `SELECT count(*) FROM fx_processed_events`))
			require.Equal(t, 1, n)
		})

		t.Run("ConsumersApart", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, base)
			other := bd.kit.Chain(t, "audit.log", framework.Handle(Booked, func(context.Context, framework.Event[BookedV1]) error { return nil }))
			env := booked(t, "1")
			testkit.RequireProcessed(t, bd.consumer.Deliver(t.Context(), t, env))
			testkit.RequireProcessed(t, other.Deliver(t.Context(), t, env)) // each consumer processes the event once
			testkit.RequireDeadLettered(t, other.DeliverBody(t.Context(), t, []byte("{")), framework.CodeMalformedEnvelope)
			require.Empty(t, bd.consumer.DeadLetters(t.Context(), t))
			require.Len(t, other.DeadLetters(t.Context(), t), 1)
		})
	})
}

func TestPostgresSchemaDropped(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	var schema string
	t.Run("Kit", func(t *testing.T) {
		kit := testkit.New(t, testkit.Config{PostgresURL: url})
		require.NoError(t, kit.DB().Get(&schema, `SELECT current_schema()`))
		require.True(t, strings.HasPrefix(schema, "testkit_"), schema)
	})
	db, err := sqlx.Open("pgx", url)
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`, schema))
	require.Zero(t, n, "the test's schema is dropped at cleanup")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, testkit.Config{}.WithDefaults().Validate())
	for name, cfg := range map[string]testkit.Config{
		"Config.Settings.attempts":         {Settings: middleware.Settings{Attempts: -1}},
		"Config.Settings.retry_delay":      {Settings: middleware.Settings{RetryDelay: -time.Second}},
		"Config.Settings.max_deliveries":   {Settings: middleware.Settings{MaxDeliveries: -1}},
		"Config.Settings.max_body_bytes":   {Settings: middleware.Settings{MaxBodyBytes: -1}},
		"Config.Settings.rate_limit":       {Settings: middleware.Settings{RateLimit: -1}},
		"Config.Settings.breaker.max_hold": {Settings: middleware.Settings{Breaker: middleware.BreakerConfig{Failures: 1, MaxHold: time.Hour}}},
		"TablePrefix":                      {TablePrefix: "No-Such"},
		"PostgresURL":                      {PostgresURL: "host=localhost user=me"},
	} {
		err := cfg.WithDefaults().Validate()
		require.ErrorContains(t, err, name, "%s", name)
	}
}

// TestNewInvalidConfig: New fails the test with the field named once,
// under one "testkit:" prefix.
func TestNewInvalidConfig(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t}
	require.Nil(t, testkit.New(rec, testkit.Config{Settings: middleware.Settings{Attempts: -1}}))
	require.Contains(t, rec.failure, "testkit: Config.Settings.attempts")
	require.NotContains(t, rec.failure, "testkit: testkit:")
}

// recorder is a TB whose Fatalf records the failure instead of ending the
// test, so that the test can check that a helper fails.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Fatalf(format string, args ...any) { r.failure = fmt.Sprintf(format, args...) }

func TestRequireHelpersFail(t *testing.T) {
	t.Parallel()
	processed := testkit.Result{Outcome: framework.Processed, Attempts: 1}
	dead := testkit.Result{Outcome: framework.DeadLettered, Code: framework.CodeRetriesExhausted, Attempts: 3}
	for name, check := range map[string]func(testing.TB){
		"Duplicate":         func(tb testing.TB) { testkit.RequireDuplicate(tb, processed) },
		"Stale":             func(tb testing.TB) { testkit.RequireStale(tb, processed) },
		"Nacked":            func(tb testing.TB) { testkit.RequireNacked(tb, processed) },
		"Processed":         func(tb testing.TB) { testkit.RequireProcessed(tb, dead) },
		"DeadLetteredOther": func(tb testing.TB) { testkit.RequireDeadLettered(tb, dead, framework.CodeTimeout) },
		"DeadLettered":      func(tb testing.TB) { testkit.RequireDeadLettered(tb, processed, framework.CodeTimeout) },
	} {
		r := &recorder{TB: t}
		check(r)
		require.NotEmpty(t, r.failure, name)
	}
	r := &recorder{TB: t}
	testkit.RequireDeadLettered(r, dead, framework.CodeRetriesExhausted)
	testkit.RequireProcessed(r, processed)
	require.Empty(t, r.failure)
	require.Equal(t, "dead_lettered (retries_exhausted) after 3 attempts", dead.String())
}

func TestEnvelopeFailsOnInvalidData(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	testkit.Envelope(r, Booked, BookedV1{}, framework.Attributes{})
	require.Contains(t, r.failure, "invalid_payload")
}
