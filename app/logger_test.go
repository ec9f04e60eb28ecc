package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestDefaultLogger(t *testing.T) {
	t.Parallel()
	t.Run("JSONWarningsAndErrors", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		logger := app.DefaultLogger(&out)
		logger.Info("attempt failed", "consumer", "c")
		logger.Debug("message handled")
		logger.Warn("message dead-lettered", "code", "no_seats")
		logger.Error("message nacked", "error", "database is locked")
		lines := testenv.JSONLines(t, out.String())
		require.Len(t, lines, 2, "info and debug are left out")
		require.Equal(t, "WARN", lines[0]["level"])
		require.Equal(t, "no_seats", lines[0]["code"])
		require.Equal(t, "ERROR", lines[1]["level"])
	})

	t.Run("JSONToAFile", func(t *testing.T) {
		t.Parallel()
		f, err := os.Create(filepath.Join(t.TempDir(), "log"))
		require.NoError(t, err)
		defer f.Close()
		app.DefaultLogger(f).Warn("message dead-lettered")
		data, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		require.Len(t, testenv.JSONLines(t, string(data)), 1, "a file is no terminal: JSON")
	})
}

// envLoggerChild makes the test binary run the service whose stderr
// TestServiceLogsToStderrByDefault reads.
const envLoggerChild = "EFFECTIVELY_TEST_LOGGER_CHILD"

const rejectingConsumer = "widgets.reject-on-widget-added"

// TestServiceLogsToStderrByDefault: a service given no logger still
// reports a dead letter, as a JSON line on stderr when stderr is not a
// terminal, and nothing below warn.
func TestServiceLogsToStderrByDefault(t *testing.T) {
	if os.Getenv(envLoggerChild) != "" {
		runRejectingService(t)
		return
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServiceLogsToStderrByDefault$", "-test.count=1")
	cmd.Env = append(os.Environ(), envLoggerChild+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, testenv.RunChild(cmd), "stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	lines := testenv.JSONLines(t, stderr.String())
	dead := testenv.WithMsg(lines, "message dead-lettered")
	require.Len(t, dead, 1, stderr.String())
	require.Equal(t, "WARN", dead[0]["level"])
	require.Equal(t, rejectingConsumer, dead[0]["consumer"])
	require.Equal(t, "widgets", dead[0]["source"])
	require.Equal(t, "w-1", dead[0]["event_id"])
	require.Equal(t, "no_seats", dead[0]["code"])
	require.Equal(t, "*errors.errorString", dead[0]["error_type"], "the handler's error by its type: its text may quote the payload (log_error_text)")
	require.NotContains(t, stderr.String(), "room 4 is full")
	for _, l := range lines {
		require.Contains(t, []any{"WARN", "ERROR"}, l["level"], "warnings and errors only: %v", l)
	}
}

// runRejectingService runs a service without a logger whose consumer
// dead-letters what it gets, until one dead letter is stored.
func runRejectingService(t *testing.T) {
	reject := func() framework.HandlerFunc[widgetAddedV1] {
		return func(context.Context, framework.Event[widgetAddedV1]) error {
			return framework.Permanent("no_seats", errors.New("room 4 is full"))
		}
	}
	b := setup(t, testConfig(t), handlers.Register(rejectingConsumer, handlers.On(widgetAdded, reject)))
	b.publish(t, "w-1", "sprocket")
	waitFor(t, "the dead letter", func() bool {
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = ?`, rejectingConsumer) == 1
	})
}

type visitBookedV1 struct {
	At time.Time `json:"at"`
}

var visitBooked = framework.Define[visitBookedV1]("visits.visit.booked", 1)

// TestLogsNeverQuotePayload: a message whose data does not decode is
// logged by code and field, never by value, in the service's lines and in
// watermill's router's, when its dead letter cannot be stored (nacked)
// and when it is.
func TestLogsNeverQuotePayload(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_4242SECRET"
	var logs testenv.Logs
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	record := func() framework.HandlerFunc[visitBookedV1] {
		return func(context.Context, framework.Event[visitBookedV1]) error { return nil }
	}
	const visits = "visits.record-on-visit-booked"
	b := setup(t, testConfig(t), fx.Supply(logger), handlers.Register(visits, handlers.On(visitBooked, record)))

	_, err := b.db.Exec(`ALTER TABLE dead_letters RENAME TO dead_letters_away`)
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{
		"specversion": "1.0", "id": "v-1", "source": "visits", "type": visitBooked.Type(), "eventversion": 1,
		"data": map[string]any{"at": "tomorrow " + secret},
	})
	require.NoError(t, err)
	require.NoError(t, b.transport.Publisher().Publish(visitBooked.Type(), message.NewMessage(watermill.NewUUID(), body)))
	waitFor(t, "the router's line of the nack", func() bool {
		return len(testenv.WithMsg(testenv.JSONLines(t, logs.String()), "Handler returned error")) > 0
	})
	_, err = b.db.Exec(`ALTER TABLE dead_letters_away RENAME TO dead_letters`)
	require.NoError(t, err)
	waitFor(t, "the dead letter", func() bool {
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = ?`, visits) == 1
	})
	waitFor(t, "the dead letter's line", func() bool {
		return len(testenv.WithMsg(testenv.JSONLines(t, logs.String()), "message dead-lettered")) == 1
	})

	require.NotContains(t, logs.String(), secret)
	require.NotContains(t, logs.String(), "tomorrow")
	lines := testenv.JSONLines(t, logs.String())
	router := testenv.WithMsg(lines, "Handler returned error")
	require.Contains(t, router[0]["error"], "data.at: not an RFC 3339 time")
	nacked := testenv.WithMsg(lines, "message nacked, it will be delivered again")
	require.NotEmpty(t, nacked)
	require.Equal(t, "data.at", nacked[0]["field"])
	dead := testenv.WithMsg(lines, "message dead-lettered")[0]
	require.Equal(t, string(framework.CodeInvalidPayload), dead["code"])
	require.Equal(t, "data.at", dead["field"])
	require.Equal(t, "v-1", dead["event_id"])
}
