package main

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestDemo runs the demo command in-process, as `make run` does, on each
// transport by configuration only, and checks its report. It sets the
// environment, so it does not run in parallel.
func TestDemo(t *testing.T) {
	tests := []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"SQLite", func(t *testing.T) map[string]string {
			return map[string]string{app.EnvDatabaseURL: filepath.Join(t.TempDir(), "data", "demo.db")}
		}},
		{"Postgres", func(t *testing.T) map[string]string {
			return map[string]string{app.EnvTransport: app.TransportPostgres, app.EnvDatabaseURL: testenv.PostgresURL(t)}
		}},
		{"AMQP", func(t *testing.T) map[string]string {
			url := testenv.Require(t, testenv.AMQPURLVar)
			purgeQueue(t, url, ConsumerName) // the tests' node is shared: the demo reports on its own messages
			return map[string]string{
				app.EnvTransport:   app.TransportAMQP,
				app.EnvAMQPURL:     url,
				app.EnvDatabaseURL: testenv.PostgresURL(t),
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{
				app.EnvTransport:    "",
				app.EnvDatabaseURL:  "",
				app.EnvTransportURL: "",
				app.EnvAMQPURL:      "",
				app.EnvTablePrefix:  "",
				app.EnvConfig:       "",
				app.EnvAutoMigrate:  "",
				app.EnvHTTPAddr:     "127.0.0.1:0",
			}
			maps.Copy(env, tt.env(t))
			for k, v := range env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var out bytes.Buffer
			cmd := demoCommand()
			cmd.SetOut(&out)
			cmd.SetArgs([]string{})
			require.NoError(t, cmd.ExecuteContext(ctx))

			report := out.String()
			t.Log(report)
			for _, want := range []string{
				`processed\s+3\b`,
				`duplicate\s+1\b`,
				`dead-lettered\s+1\b`,
				`reminders scheduled by these events: 3\b`,
				`dead letter #\d+: event poison-\d+, code invalid_payload,`,
				`demo done\.`,
			} {
				require.Regexp(t, want, report)
			}
			if u, err := url.Parse(env[app.EnvDatabaseURL]); err == nil {
				if password, ok := u.User.Password(); ok {
					require.NotContains(t, report, ":"+password+"@", "the demo prints the database URL without its password")
				}
			}
		})
	}
}

// purgeQueue empties the queue name on the broker at url, when it exists:
// messages left in it by an earlier run on the same node.
func purgeQueue(t *testing.T, url, name string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, _ = ch.QueuePurge(name, false) // a queue that does not exist has nothing to purge
}

// TestDemoBesideAService: the demo run on the database of a running
// service of the same consumer (PostgreSQL transport: one consumer group)
// says that the service took its messages, instead of waiting two minutes
// for them and ending with a bare deadline.
func TestDemoBesideAService(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	for k, v := range map[string]string{
		app.EnvTransport: app.TransportPostgres, app.EnvDatabaseURL: dbURL, app.EnvTransportURL: "",
		app.EnvAMQPURL: "", app.EnvTablePrefix: "", app.EnvConfig: "", app.EnvAutoMigrate: "true", app.EnvHTTPAddr: "",
	} {
		t.Setenv(k, v)
	}
	service := app.New(Module, fx.NopLogger, fx.Supply(slog.New(slog.DiscardHandler)))
	require.NoError(t, service.Err())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, service.Start(ctx))
	t.Cleanup(func() { require.NoError(t, service.Stop(context.Background())) })

	var err error
	for range 5 { // the demo may still take every message once in a while
		var out bytes.Buffer
		cmd := demoCommand()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{})
		if err = cmd.ExecuteContext(ctx); err != nil {
			break
		}
	}
	require.ErrorContains(t, err, "another consumer notifications.remind-on-appointment-booked of this database took the demo's messages")
	require.NoError(t, ctx.Err(), "told at once, not at the deadline")
}

// TestDemoAfterReplays runs the demo again on its SQLite file after the
// operator replayed its dead letters, as the README's commands lead a
// newcomer to do: the service publishes the replays while the demo runs,
// and the report still counts the demo's own five events (it counted
// every message of the consumer, the replays among its dead letters, and
// could stop waiting before the demo's own were handled).
func TestDemoAfterReplays(t *testing.T) {
	for k, v := range map[string]string{
		app.EnvTransport: "", app.EnvDatabaseURL: filepath.Join(t.TempDir(), "demo.db"), app.EnvTransportURL: "",
		app.EnvAMQPURL: "", app.EnvTablePrefix: "", app.EnvConfig: "", app.EnvAutoMigrate: "", app.EnvHTTPAddr: "127.0.0.1:0",
	} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	demo := func() string {
		var out bytes.Buffer
		cmd := demoCommand()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{})
		require.NoError(t, cmd.ExecuteContext(ctx))
		return out.String()
	}
	for range 3 {
		demo()
	}
	replay := app.Command("notifications", Module)
	replay.SetOut(&bytes.Buffer{})
	replay.SetArgs([]string{"dead-letters", "replay", "--code", "invalid_payload", "--reason", "again", "--by", "test"})
	require.NoError(t, replay.ExecuteContext(ctx))

	report := demo()
	t.Log(report)
	for _, want := range []string{
		`processed\s+3\n`,
		`duplicate\s+1\s`,
		`dead-lettered\s+1\n`,
		`reminders scheduled by these events: 3\b`,
		`dead letter #\d+: event poison-\d+, code invalid_payload,`,
	} {
		require.Regexp(t, want, report)
	}
}
