package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

func newLogger(w *testenv.Logs) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestLogsCarryTheHandlersError: each failed attempt is logged at info and
// the dead letter at warn, with the consumer, the event's source and id,
// the attempt and the code; the handler's own error by its type (and a
// database error's SQLSTATE) by default, which keeps the values it quotes
// out of the logs, and by its text with LogErrorText.
func TestLogsCarryTheHandlersError(t *testing.T) {
	t.Parallel()
	const secret = "appt-4242-SECRET"
	for _, text := range []bool{false, true} {
		var logs testenv.Logs
		store, err := memory.NewStore(memory.StoreConfig{})
		require.NoError(t, err)
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
		require.NoError(t, err)
		c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error {
			return fmt.Errorf("schedule reminder of %s: %w", secret, &pgconn.PgError{Severity: "ERROR", Code: "42703", Message: `column "` + secret + `" does not exist`})
		}))
		require.NoError(t, err)
		h, _, err := middleware.Handler(middleware.Config{
			Consumer: c, UnitOfWork: uow, Store: store,
			Settings: middleware.Settings{
				Attempts:     3,
				RetryDelay:   time.Millisecond,
				LogErrorText: text,
			},
			Logger: newLogger(&logs),
		})
		require.NoError(t, err)
		env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{ID: "n-1", Source: "notes"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, h(msg))

		checkError := func(line map[string]any) {
			t.Helper()
			require.Equal(t, "42703", line["sqlstate"])
			if text {
				require.Equal(t, `schedule reminder of `+secret+`: ERROR: column "`+secret+`" does not exist (SQLSTATE 42703)`, line["error"])
				return
			}
			require.Equal(t, "*pgconn.PgError", line["error_type"])
			require.NotContains(t, line, "error")
		}
		attempts := logs.Lines(t, "attempt failed")
		require.Len(t, attempts, 3, logs.String())
		for i, line := range attempts {
			require.Equal(t, "INFO", line["level"])
			require.Equal(t, consumerName, line["consumer"])
			require.Equal(t, "notes", line["source"])
			require.Equal(t, "n-1", line["event_id"])
			require.InDelta(t, i+1, line["attempt"], 0)
			checkError(line)
			require.NotContains(t, line, "code", "a plain error has no code before the attempts run out")
		}
		dead := logs.Lines(t, "message dead-lettered")
		require.Len(t, dead, 1, logs.String())
		require.Equal(t, "WARN", dead[0]["level"])
		require.Equal(t, consumerName, dead[0]["consumer"])
		require.Equal(t, "notes", dead[0]["source"])
		require.Equal(t, "n-1", dead[0]["event_id"])
		require.InDelta(t, 3, dead[0]["attempts"], 0)
		require.Equal(t, string(framework.CodeRetriesExhausted), dead[0]["code"])
		checkError(dead[0])
		if !text {
			require.NotContains(t, logs.String(), secret, "no value of the payload in the logs")
		}
	}
}

type visitV1 struct {
	At    time.Time `json:"at"`
	Email string    `json:"email" validate:"omitempty,email"`
}

var visited = framework.Define[visitV1]("visits.visit.booked", 1)

// TestLogsNeverQuotePayload: a message whose data fails to decode or
// validate is logged by code and field name, never by value: when it is
// dead-lettered, and when storing its dead letter fails and it is nacked.
func TestLogsNeverQuotePayload(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_4242SECRET"
	var logs testenv.Logs
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(visited, func(context.Context, framework.Event[visitV1]) error { return nil }))
	require.NoError(t, err)
	h, _, err := middleware.Handler(middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: store,
		Logger: newLogger(&logs),
	})
	require.NoError(t, err)
	deliver := func(id string, data map[string]any) error {
		body, err := json.Marshal(map[string]any{
			"specversion": "1.0", "id": id, "source": "visits", "type": visited.Type(), "eventversion": 1, "data": data,
		})
		require.NoError(t, err)
		return h(message.NewMessage(watermill.NewUUID(), body))
	}

	_, err = db.Exec(`ALTER TABLE dead_letters RENAME TO dead_letters_away`)
	require.NoError(t, err)
	require.Error(t, deliver("v-1", map[string]any{"at": "tomorrow " + secret}), "no dead letter stored: nacked")
	_, err = db.Exec(`ALTER TABLE dead_letters_away RENAME TO dead_letters`)
	require.NoError(t, err)
	require.NoError(t, deliver("v-1", map[string]any{"at": "tomorrow " + secret}))
	require.NoError(t, deliver("v-2", map[string]any{"email": secret}))
	require.NotContains(t, logs.String(), secret)
	require.NotContains(t, logs.String(), "tomorrow")

	nacked := logs.Lines(t, "message nacked, it will be delivered again")
	require.Len(t, nacked, 1, logs.String())
	require.Equal(t, "data.at", nacked[0]["field"])
	dead := logs.Lines(t, "message dead-lettered")
	require.Len(t, dead, 2, logs.String())
	for i, field := range []string{"data.at", "data.email"} {
		require.Equal(t, string(framework.CodeInvalidPayload), dead[i]["code"])
		require.Equal(t, field, dead[i]["field"])
		require.Contains(t, dead[i]["error"], field+": ")
	}
}
