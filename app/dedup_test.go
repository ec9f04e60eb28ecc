package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// The consumers of the deduplication tests: the same handler, one of
// them without deduplication.
const (
	everyDelivery = "widgets.count-every-delivery"
	onceAnEvent   = "widgets.count-each-widget"
	noDedupReason = "counts deliveries, not events, on purpose"
)

// logBuffer is a log output that tests read while the application writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// newJSONLogger returns a logger of every level that writes JSON lines
// to w.
func newJSONLogger(w *logBuffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// lines returns the JSON log lines written so far whose message starts
// with msg.
func (b *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for l := range strings.Lines(b.buf.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec))
		if m, _ := rec["msg"].(string); strings.HasPrefix(m, msg) {
			out = append(out, rec)
		}
	}
	return out
}

// newCountRun is a handler that writes one row per run, named after
// its consumer.
func newCountRun(consumer string) func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
	return func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		insert := db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`)
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, consumer, ev.ID)
			return err
		}
	}
}

// dedupModule declares everyDelivery, without deduplication, and
// onceAnEvent, with it.
func dedupModule() fx.Option {
	return fx.Options(
		fx.Supply(widgetMigrations),
		handlers.Register(everyDelivery,
			handlers.WithoutDedup(noDedupReason),
			handlers.On(widgetAdded, newCountRun(everyDelivery)),
		),
		handlers.Register(onceAnEvent, handlers.On(widgetAdded, newCountRun(onceAnEvent))),
	)
}

// TestWithoutDedup: a consumer declared WithoutDedup handles a
// redelivered event again, processed each time and never a duplicate,
// while a consumer beside it skips the redelivery; the application logs
// the consumer without deduplication at start, with its reason. On SQLite
// and PostgreSQL, with group commit on (the default).
func TestWithoutDedup(t *testing.T) {
	t.Parallel()
	for name, pgURL := range map[string]string{"SQLite": "", "PostgreSQL": testenv.Require(t, testenv.PostgresURLVar)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logs := &logBuffer{}
			svc := apptest.New(t, dedupModule(), apptest.Config{PostgresURL: pgURL, Logger: newJSONLogger(logs)})

			started := logs.lines(t, "consumer runs without deduplication")
			require.Len(t, started, 1, "one line per consumer without deduplication")
			require.Equal(t, everyDelivery, started[0]["consumer"])
			require.Equal(t, noDedupReason, started[0]["reason"])
			require.Equal(t, "WARN", started[0]["level"])

			env, err := widgetAdded.Envelope(widgetAddedV1{Name: "w"}, framework.Attributes{ID: "evt-1", Source: "widgets"})
			require.NoError(t, err)
			for _, want := range []framework.Outcome{framework.Processed, framework.Processed} {
				res, err := svc.Deliver(t.Context(), everyDelivery, env)
				require.NoError(t, err)
				require.Equal(t, want, res.Outcome, "%s", res)
			}
			for _, want := range []framework.Outcome{framework.Processed, framework.Duplicate} {
				res, err := svc.Deliver(t.Context(), onceAnEvent, env)
				require.NoError(t, err)
				require.Equal(t, want, res.Outcome, "%s", res)
			}
			var rows []string
			require.NoError(t, svc.DB().SelectContext(t.Context(), &rows, `SELECT name FROM widgets ORDER BY name`))
			require.Equal(t, []string{onceAnEvent, everyDelivery, everyDelivery}, rows)
		})
	}
}

// TestWithoutDedupNeedsReason: WithoutDedup without a reason (or with
// blanks only) refuses start-up, naming the consumer.
func TestWithoutDedupNeedsReason(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"", "  "} {
		service := app.New(
			handlers.Register(consumerName, handlers.WithoutDedup(reason), handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(testConfig(t)),
		)
		err := service.Err()
		require.ErrorContains(t, err, "consumer "+consumerName+": WithoutDedup needs a reason")
	}
}

// outlivingStore is a store that says its marks outlive a rollback.
type outlivingStore struct{ driver.Store }

func (outlivingStore) MarkScope() driver.MarkScope { return driver.MarkOutlivesRollback }

// TestMarkCheck: the application refuses to start with a store whose
// marks neither join the database transaction nor go when an attempt
// fails, naming the consumer and the check; it starts with the in-memory
// store, whose marks go with a rollback, and says at start what that
// store cannot keep; a consumer without deduplication is not named there.
func TestMarkCheck(t *testing.T) {
	t.Parallel()
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		module := fx.Options(dedupModule(), fx.Decorate(func(s driver.Store) driver.Store { return outlivingStore{s} }))
		_, err := apptest.Start(t.Context(), module, apptest.Config{})
		require.ErrorContains(t, err, "consumer "+onceAnEvent+": UnitOfWorkConfig.Store: mark check: processed store app_test.outlivingStore keeps its marks outside the database transaction")
	})
	t.Run("MemoryStore", func(t *testing.T) {
		t.Parallel()
		logs := &logBuffer{}
		module := fx.Options(dedupModule(), fx.Decorate(func(driver.Store) (driver.Store, error) {
			return memory.NewStore(memory.StoreConfig{})
		}))
		svc := apptest.New(t, module, apptest.Config{Logger: newJSONLogger(logs)})
		warned := logs.lines(t, "processed store keeps its marks outside the database transaction")
		require.Len(t, warned, 1)
		require.Equal(t, "*memory.Store", warned[0]["store"])
		require.Equal(t, onceAnEvent, warned[0]["consumers"])

		env, err := widgetAdded.Envelope(widgetAddedV1{Name: "w"}, framework.Attributes{ID: "evt-1", Source: "widgets"})
		require.NoError(t, err)
		for _, want := range []framework.Outcome{framework.Processed, framework.Duplicate} {
			res, err := svc.Deliver(t.Context(), onceAnEvent, env)
			require.NoError(t, err)
			require.Equal(t, want, res.Outcome, "%s", res)
		}
	})
}
