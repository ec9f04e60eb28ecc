package app_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"
	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that no test leaks a goroutine: every application a test
// starts must stop its router, subscribers, HTTP server and databases.
//
// One leak is watermill's, not ours: when a handler's Subscribe fails, Run
// returns, but the router's watcher goroutine waits forever for that
// handler, counted since AddHandler and never started
// (TestUntilRunning/NackedWhenNeverRunning). A start that fails so ends
// the process anyway.
//
// The others are watermill-amqp's, as in framework/amqp's TestMain: a
// connection closed while the broker is unreachable (the tests of a broker
// that is down or refuses the credentials) leaves its
// handleConnectionClose goroutine waiting for a reconnection that never
// comes, and a connection the broker drops while it closes blocks
// amqp091-go's shutdown on an unread channel (and with it that
// connection's reader and heartbeater).
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/message.(*Router).watchAllHandlersStopped.func1"),
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp.(*ConnectionWrapper).handleConnectionClose"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).reader"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).heartbeater"),
	)
}

// waitLimit bounds every wait; it fails only on a hang.
const waitLimit = 30 * time.Second

type widgetAddedV1 struct {
	Name string `json:"name" validate:"required"`
}

var widgetAdded = framework.Define[widgetAddedV1]("widgets.widget.added", 1)

const consumerName = "widgets.count-on-widget-added"

// widgetMigrations are the test application's own migrations.
var widgetMigrations = app.Migrations{FS: fstest.MapFS{
	"00001_widgets.sql": {Data: []byte(`-- +goose Up
CREATE TABLE widgets (name TEXT NOT NULL, event_id TEXT NOT NULL);

-- +goose Down
DROP TABLE widgets;
`)},
}}

// newAddWidget is the test consumer's handler: one row per event, in the
// attempt's transaction.
func newAddWidget(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
	return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO widgets (name, event_id) VALUES (?, ?)`, ev.Data.Name, ev.ID)
		return err
	}
}

// bundle is one test's application.
type bundle struct {
	cfg       app.Config
	service   *fx.App
	db        *sqlx.DB
	transport driver.Transport
	http      *app.HTTP
	// def is the widget's event type: widgetAdded unless set (see
	// setupIsolated).
	def *framework.Definition[widgetAddedV1]
}

// testConfig returns a configuration on a fresh SQLite file, migrated at
// start, with HTTP on a free port.
func testConfig(t *testing.T) app.Config {
	t.Helper()
	cfg, err := app.LoadConfig(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	cfg.DatabaseURL = filepath.Join(t.TempDir(), "data", "app.db")
	cfg.TransportURL = cfg.DatabaseURL
	cfg.AutoMigrate = true
	cfg.HTTPAddr = "127.0.0.1:0"
	return cfg
}

// setup builds the application of cfg with the widget consumer and opts,
// and starts it; it stops when the test ends.
func setup(t *testing.T, cfg app.Config, opts ...fx.Option) *bundle {
	t.Helper()
	return setupWith(t, cfg, handlers.On(widgetAdded, newAddWidget), opts...)
}

// setupWith is setup with the widget consumer's route h.
func setupWith(t *testing.T, cfg app.Config, h handlers.Route, opts ...fx.Option) *bundle {
	t.Helper()
	b := &bundle{cfg: cfg}
	b.service = app.New(
		handlers.Register(consumerName, h),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.Options(opts...),
		fx.Populate(&b.db, &b.transport, &b.http),
	)
	b.start(t)
	return b
}

// setupIsolated is setupWith for a test on RabbitMQ beside others: its
// widget event type and its consumer have names of its own, as the
// broker is shared and an event type's exchange hands each event to
// every queue bound to it, whose consumers compete for the queue's
// messages. It returns the bundle and the consumer's name.
func setupIsolated(t *testing.T, cfg app.Config, opts ...fx.Option) (*bundle, string) {
	t.Helper()
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	def := framework.Define[widgetAddedV1]("widgets.widget.added-"+suffix, 1)
	consumer := "widgets.count-" + suffix
	b := &bundle{cfg: cfg, def: &def}
	b.service = app.New(
		handlers.Register(consumer, handlers.On(def, newAddWidgetRebound)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.Options(opts...),
		fx.Populate(&b.db, &b.transport, &b.http),
	)
	b.start(t)
	return b, consumer
}

// start starts b's service, built without error, and stops it when the
// test ends.
func (b *bundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.service.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, b.service.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, b.service.Stop(ctx))
	})
}

// publish publishes the widget name as event id of source "widgets".
func (b *bundle) publish(t *testing.T, id, name string) {
	t.Helper()
	b.publishFrom(t, "widgets", id, name)
}

// publishFrom publishes the widget name as event id of source.
func (b *bundle) publishFrom(t *testing.T, source, id, name string) {
	t.Helper()
	def := widgetAdded
	if b.def != nil {
		def = *b.def
	}
	env, err := def.Envelope(widgetAddedV1{Name: name}, framework.Attributes{ID: id, Source: source})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	require.NoError(t, b.transport.Publisher().Publish(def.Type(), msg))
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Get(&n, query, args...))
	return n
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitLimit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestApp(t *testing.T) {
	t.Parallel()

	t.Run("ConsumesOnceWithUserMiddleware", func(t *testing.T) {
		t.Parallel()
		var (
			mu            sync.Mutex
			outerSawTx    []bool
			innerSawTx    []bool
			outerSawError []error
		)
		sawTx := func(into *[]bool) message.HandlerMiddleware {
			return func(next message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					_, ok := driver.TxFromContext(msg.Context())
					out, err := next(msg)
					mu.Lock()
					defer mu.Unlock()
					*into = append(*into, ok)
					if into == &outerSawTx {
						outerSawError = append(outerSawError, err)
					}
					return out, err
				}
			}
		}
		b := setup(t, testConfig(t), fx.Supply(app.Middleware{
			Outer: []message.HandlerMiddleware{sawTx(&outerSawTx)},
			Inner: []message.HandlerMiddleware{sawTx(&innerSawTx)},
		}))
		b.publish(t, "w-1", "sprocket")
		b.publish(t, "w-1", "sprocket") // a duplicate
		waitFor(t, "two deliveries", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(outerSawTx) == 2
		})
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'w-1'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM processed_events WHERE consumer = ?`, consumerName))
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []bool{false, false}, outerSawTx, "outer middleware runs outside the transaction")
		require.Equal(t, []error{nil, nil}, outerSawError, "both deliveries are acknowledged")
		require.Equal(t, []bool{true}, innerSawTx, "inner middleware runs in the transaction, not for the duplicate")
	})

	t.Run("HTTP", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testConfig(t))
		addr := b.http.Addr()
		require.NotEmpty(t, addr)
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitLimit}
		get := func(path string) (int, string) {
			t.Helper()
			resp, err := client.Get("http://" + addr + path)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(body)
		}
		code, body := get("/healthz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok\n", body)
		// Ready once its database answers within /readyz's budget, which
		// a loaded machine can miss for a moment: 503, then 200.
		waitFor(t, "/readyz 200", func() bool {
			code, body = get("/readyz")
			return code == http.StatusOK
		})
		require.JSONEq(t, `{"status":"ready","consumers":[{"consumer":"`+consumerName+`","failing_messages":0,"oldest_failing_seconds":0,"hold_up_limit_seconds":930,"held_up":false}]}`, body)

		b.publish(t, "w-1", "sprocket")
		waitFor(t, "the widget", func() bool {
			return b.count(t, `SELECT count(*) FROM widgets`) == 1
		})
		// The outcome is counted after the handler's transaction commits,
		// so the widget can be seen a moment before the counter moves.
		processed := regexp.MustCompile(`effectively_messages_total\{[^}]*consumer="` + consumerName + `"[^}]*outcome="processed"[^}]*\} 1`)
		waitFor(t, "the processed outcome counted", func() bool {
			code, body = get("/metrics")
			return code == http.StatusOK && processed.MatchString(body)
		})
		require.Contains(t, body, "go_goroutines")
	})

	t.Run("HTTPOff", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.HTTPAddr = ""
		b := setup(t, cfg)
		require.Empty(t, b.http.Addr())
	})

	t.Run("CreatesSQLiteFolder", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.DatabaseURL = "file:" + filepath.Join(t.TempDir(), "a", "b", "c", "stores.db")
		cfg.TransportURL = filepath.Join(t.TempDir(), "d", "e", "transport.db")
		setup(t, cfg)
		require.FileExists(t, cfg.DatabaseURL[len("file:"):])
		require.FileExists(t, cfg.TransportURL)
	})

	t.Run("SeparateTransportFile", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.TransportURL = filepath.Join(t.TempDir(), "transport.db")
		b := setup(t, cfg)
		b.publish(t, "w-1", "sprocket")
		waitFor(t, "the widget", func() bool {
			return b.count(t, `SELECT count(*) FROM widgets`) == 1
		})
		var tables int
		require.NoError(t, b.db.Get(&tables, `SELECT count(*) FROM sqlite_master WHERE name = 'pubsub_messages'`))
		require.Zero(t, tables, "the messages live in the transport's file")
	})

	t.Run("DuplicateConsumerName", func(t *testing.T) {
		t.Parallel()
		other := func(ctx context.Context, ev framework.Event[widgetAddedV1]) error { return nil }
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			handlers.Register(consumerName, handlers.On(widgetAdded, other)),
			fx.Replace(testConfig(t)),
		)
		err := service.Err()
		require.Error(t, err)
		require.ErrorContains(t, err, "consumer name declared more than once: "+consumerName)
	})

	t.Run("BadConfigurationRefusesStart", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Transport = "carrier-pigeon"
		service := app.New(fx.Replace(cfg))
		// The replaced configuration is not validated again; the transport
		// refuses it, naming the key.
		require.ErrorContains(t, service.Err(), app.EnvTransport)
	})

	t.Run("ServeStopsWithContext", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(testConfig(t)),
			// Invoked last, so its hook runs once everything else started.
			fx.Invoke(func(lc fx.Lifecycle) { lc.Append(fx.StartHook(func() { close(started) })) }),
		)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- app.Serve(ctx, service) }()
		select {
		case <-started:
		case <-time.After(waitLimit):
			t.Fatal("the application did not start")
		}
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitLimit):
			t.Fatal("Serve did not return after its context ended")
		}
	})

	t.Run("ServeStopsWhileStarting", func(t *testing.T) {
		t.Parallel()
		// No broker: the transport's start hook retries until the start
		// times out, an hour from now. Asked to stop, it gives up, fx rolls
		// back what started, and Serve returns nil at once.
		cfg := testConfig(t)
		cfg.Transport = "amqp"
		cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:1/"
		var db *sqlx.DB
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
			fx.StartTimeout(time.Hour),
			fx.Populate(&db),
		)
		require.NoError(t, service.Err())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- app.Serve(ctx, service) }()
		time.Sleep(100 * time.Millisecond) // into the retries (either way, Serve must stop)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitLimit):
			t.Fatal("Serve did not return when asked to stop while starting")
		}
		require.ErrorContains(t, db.Ping(), "database is closed", "the hooks that started were stopped")
	})
}

// TestMigrateCommand runs the migrate subcommand, configured by the
// environment as in production; it sets the environment, so it does not
// run in parallel.
func TestMigrateCommand(t *testing.T) {
	for _, prefix := range []string{"", "eff_"} {
		t.Run("Prefix"+prefix, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "missing", "folder", "app.db")
			t.Setenv(app.EnvDatabaseURL, path)
			t.Setenv(app.EnvTablePrefix, prefix)
			t.Setenv(app.EnvTransport, "")
			t.Setenv(app.EnvConfig, "")

			var out bytes.Buffer
			cmd := app.Command("widgets", fx.Options(
				handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
				fx.Supply(widgetMigrations),
			))
			cmd.SetOut(&out)
			cmd.SetArgs([]string{"migrate"})
			require.NoError(t, cmd.ExecuteContext(context.Background()))
			require.Equal(t, "migrations applied\n", out.String())

			db, err := sqlite.Open(context.Background(), path, sqlite.OpenConfig{})
			require.NoError(t, err)
			defer db.Close()
			var tables []string
			require.NoError(t, db.Select(&tables, `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`))
			for _, want := range []string{"widgets", prefix + "processed_events", prefix + "dead_letters", prefix + "deliveries", prefix + "outbox"} {
				require.Contains(t, tables, want)
			}

			// Applying them again changes nothing.
			out.Reset()
			require.NoError(t, cmd.ExecuteContext(context.Background()))
		})
	}

	t.Run("BadConfiguration", func(t *testing.T) {
		t.Setenv(app.EnvDatabaseURL, filepath.Join(t.TempDir(), "app.db"))
		t.Setenv(app.EnvTablePrefix, "bad-prefix")
		cmd := app.Command("widgets", fx.Options())
		cmd.SetArgs([]string{"migrate"})
		cmd.SetOut(io.Discard)
		err := cmd.ExecuteContext(context.Background())
		require.ErrorContains(t, err, app.EnvTablePrefix)
	})
}
