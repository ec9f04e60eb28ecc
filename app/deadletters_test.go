package app_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

const pickyConsumer = "widgets.picky"

// TestDeadLettersCommand drives the operator's commands against a running
// service: list and show what a consumer gave up on, replay one to that
// consumer alone once the cause is fixed, discard another. It sets the
// environment, so it does not run in parallel.
func TestDeadLettersCommand(t *testing.T) {
	var rejecting atomic.Bool
	rejecting.Store(true)
	picky := handlers.Consumer(pickyConsumer, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			if rejecting.Load() {
				return framework.Permanent("widget_rejected", errors.New("not today"))
			}
			_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO widgets (name, event_id) VALUES (?, ?)`, "picky:"+ev.Data.Name, ev.ID)
			return err
		}
	}))
	cfg := testConfig(t)
	b := setup(t, cfg, picky)
	for k, v := range map[string]string{
		app.EnvTransport: "", app.EnvDatabaseURL: cfg.DatabaseURL, app.EnvTransportURL: "", app.EnvAMQPURL: "",
		app.EnvTablePrefix: "", app.EnvConfig: "", app.EnvAutoMigrate: "", app.EnvHTTPAddr: "",
	} {
		t.Setenv(k, v)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := app.Command("widgets", fx.Options(
			handlers.Consumer(consumerName, handlers.On(widgetAdded, newAddWidget)),
			picky,
			fx.Supply(widgetMigrations),
		))
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	deadLetters := func() int {
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = ?`, pickyConsumer)
	}

	b.publish(t, "w-1", "one")
	b.publish(t, "w-2", "two")
	waitFor(t, "two dead letters", func() bool { return deadLetters() == 2 })
	var ids []int64
	require.NoError(t, b.db.Select(&ids, `SELECT id FROM dead_letters WHERE consumer = ? ORDER BY event_id`, pickyConsumer))

	out, err := run("dead-letters", "list", "--consumer", pickyConsumer)
	require.NoError(t, err)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+widgets\.picky\s+widget_rejected\s+widgets\.widget\.added\s+1\s+widgets\s+w-1\s+1\s+0\s+\S+\s+pending$`, ids[0]), out)
	require.Contains(t, out, "w-2")

	out, err = run("dl", "show", fmt.Sprint(ids[0]))
	require.NoError(t, err)
	require.Regexp(t, `code\s+widget_rejected`, out)
	require.Contains(t, out, `"name": "one"`)
	require.NotContains(t, out, "not today", "a dead letter never holds the error's text")

	// The cause is fixed: replay the first.
	rejecting.Store(false)
	out, err = run("dead-letters", "replay", fmt.Sprint(ids[0]), "--by", "tester", "--reason", "rejection fixed")
	require.NoError(t, err)
	require.Contains(t, out, fmt.Sprintf("dead letter %d replayed", ids[0]))
	waitFor(t, "the replay handled", func() bool {
		return b.count(t, `SELECT count(*) FROM widgets WHERE name = 'picky:one'`) == 1
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM widgets WHERE name = 'one'`), "the other consumer of the type does not see the replay")
	out, err = run("dead-letters", "show", fmt.Sprint(ids[0]))
	require.NoError(t, err)
	require.Regexp(t, `status\s+replayed`, out)
	require.Contains(t, out, "replayed by tester")

	_, err = run("dead-letters", "discard", fmt.Sprint(ids[1]))
	require.ErrorContains(t, err, "--reason")
	out, err = run("dead-letters", "discard", fmt.Sprint(ids[1]), "--by", "tester", "--reason", "a test widget")
	require.NoError(t, err)
	require.Contains(t, out, "discarded")
	_, err = run("dead-letters", "replay", fmt.Sprint(ids[1]))
	require.ErrorContains(t, err, "is discarded, not pending")

	out, err = run("dead-letters", "list")
	require.NoError(t, err)
	require.NotContains(t, out, "w-1", "only pending ones by default")
	out, err = run("dead-letters", "list", "--status", "all", "--code", "widget_rejected")
	require.NoError(t, err)
	require.Contains(t, out, "replayed")
	require.Contains(t, out, "discarded")

	_, err = run("dead-letters", "show", "x")
	require.ErrorContains(t, err, "want a positive integer")
	_, err = run("dead-letters", "show", "999")
	require.ErrorIs(t, err, framework.ErrNotFound)
}
