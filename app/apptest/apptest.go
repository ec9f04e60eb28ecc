package apptest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/pgschema"
	"github.com/effectively-once/effectively/middleware"
)

// DefaultOutcomeTimeout is how long Publish, Deliver and Await wait for an
// outcome by default before they give up with an error: far above what a
// healthy test needs, so that it fails only a test that would hang.
const DefaultOutcomeTimeout = time.Minute

// The SQLite files Start creates in a temporary folder of its own.
const (
	// DatabaseFile holds the stores and, with the sqlite transport, its
	// messages.
	DatabaseFile = "app.db"
	// TransportFile holds the sqlite transport's messages when the stores
	// are on PostgreSQL.
	TransportFile = "transport.db"
)

// setupTimeout bounds creating and dropping a PostgreSQL schema.
const setupTimeout = time.Minute

// Config configures a test application. The zero value runs the module on
// a fresh SQLite file with the sqlite transport.
type Config struct {
	// PostgresURL, when set, puts the stores on PostgreSQL: Start creates
	// a schema of the test's own on that server, points the application at
	// it (search_path in the URL) and drops it on Close, so that parallel
	// tests never see each other's rows. It must be a postgres:// or
	// postgresql:// URL; the sqlite transport then keeps its messages in
	// a SQLite file of its own. A test that runs everywhere sets it from
	// the environment, as with testkit. Defaults to empty: SQLite.
	PostgresURL string
	// Transport is app.TransportSQLite or app.TransportMemory. Defaults to
	// app.TransportSQLite, which acknowledges in the handler's transaction
	// when the stores share its file.
	Transport string
	// TablePrefix prefixes every table the framework owns, as
	// EFFECTIVELY_TABLE_PREFIX does. Defaults to none.
	TablePrefix string
	// Defaults are the consumers' settings, as the YAML's defaults. Zero
	// fields take testkit's values (Attempts testkit.DefaultAttempts,
	// RetryDelay testkit.DefaultRetryDelay, Timeout
	// testkit.DefaultTimeout), then the application's.
	Defaults middleware.Settings
	// Consumers holds per-consumer settings, keyed by consumer name, as
	// the YAML's consumers. Defaults to none.
	Consumers map[string]middleware.Settings
	// Service is the service's own settings, YAML as it would be written
	// under service: in the configuration file (app.NewServiceSection):
	// the module decodes it as in production (app.ServiceConfig,
	// app.Config.DecodeService), and a module that decodes none refuses
	// to start with it. Defaults to none.
	Service string
	// OutcomeTimeout bounds each wait for an outcome. Defaults to
	// DefaultOutcomeTimeout.
	OutcomeTimeout time.Duration
	// Logger receives the application's logs; the kit supplies it, so the
	// module must not supply a *slog.Logger of its own. Defaults to
	// discarding them (a service given none logs to stderr).
	Logger *slog.Logger
	// Crash, when set, is called at each crash point of every delivery
	// the application handles (testkit.WithCrashHook puts it on the
	// message's context, before the consumer's chain): a delivery it
	// makes die is reported testkit.Crashed, is not acknowledged, and the
	// transport delivers the message again, whose outcome Await returns.
	// testkit.CrashOnce makes one delivery die. Defaults to none.
	Crash testkit.CrashHook
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Transport = cmp.Or(c.Transport, app.TransportSQLite)
	c.Defaults.Attempts = cmp.Or(c.Defaults.Attempts, testkit.DefaultAttempts)
	c.Defaults.RetryDelay = cmp.Or(c.Defaults.RetryDelay, testkit.DefaultRetryDelay)
	c.Defaults.Timeout = cmp.Or(c.Defaults.Timeout, testkit.DefaultTimeout)
	c.OutcomeTimeout = cmp.Or(c.OutcomeTimeout, DefaultOutcomeTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field of c. The consumers' settings
// are checked by the application, as at any start.
func (c Config) Validate() error {
	switch {
	case c.Transport != app.TransportSQLite && c.Transport != app.TransportMemory:
		return fmt.Errorf("apptest: Transport: want %s or %s, got %q", app.TransportSQLite, app.TransportMemory, c.Transport)
	case c.OutcomeTimeout < 0:
		return fmt.Errorf("apptest: OutcomeTimeout must not be negative, got %s", c.OutcomeTimeout)
	}
	if err := migrate.ValidateTablePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("apptest: TablePrefix: %w", err)
	}
	if c.PostgresURL != "" {
		if err := pgschema.CheckURL(c.PostgresURL); err != nil {
			return fmt.Errorf("apptest: PostgresURL: %w", err)
		}
	}
	return nil
}

// App is a service's fx module running in the real application (app.New),
// on a database of the test's own. Create it with New in a test, or Start
// and Close elsewhere.
type App struct {
	cfg       Config
	appCfg    app.Config
	fx        *fx.App
	db        *sqlx.DB
	store     driver.Store
	transport driver.Transport
	registry  *handlers.Registry
	outcomes  *outcomes
	// undo removes what Start created besides the application (the
	// temporary folder, the PostgreSQL schema), the last first.
	undo []func(ctx context.Context) error
}

// New starts module as Start does, with the test's context, stops it and
// removes its database when the test ends, and fails the test when it
// cannot start.
func New(t testing.TB, module fx.Option, cfg Config) *App {
	t.Helper()
	a, err := Start(t.Context(), module, cfg)
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	t.Cleanup(func() {
		// t.Context() has ended by now.
		if err := a.Close(context.Background()); err != nil {
			t.Errorf("%v", err)
		}
	})
	return a
}

// Start runs module, the service's own fx options (its handlers.Register
// declarations, the constructors of its handlers' dependencies, its
// app.Middleware and app.Migrations), in the framework's application
// (app.New) with a configuration of the test's own: the database of cfg,
// migrated at start with the framework's and the module's migrations,
// the transport of cfg, and no HTTP server. It returns once every
// consumer subscribed. ctx bounds the start; Close stops the application
// and removes the database.
func Start(ctx context.Context, module fx.Option, cfg Config) (*App, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, outcomes: newOutcomes()}
	if err := a.start(ctx, module); err != nil {
		return nil, errors.Join(err, a.removeDatabase(context.WithoutCancel(ctx)))
	}
	return a, nil
}

func (a *App) start(ctx context.Context, module fx.Option) error {
	dir, err := os.MkdirTemp("", "apptest-")
	if err != nil {
		return fmt.Errorf("apptest: %w", err)
	}
	a.undo = append(a.undo, func(context.Context) error { return os.RemoveAll(dir) })
	databaseURL, transportURL := filepath.Join(dir, DatabaseFile), ""
	if a.cfg.PostgresURL != "" {
		schema, err := a.createSchema(ctx)
		if err != nil {
			return err
		}
		databaseURL = schema
		if a.cfg.Transport == app.TransportSQLite {
			transportURL = filepath.Join(dir, TransportFile)
		}
	}
	a.appCfg = app.Config{
		Transport:    a.cfg.Transport,
		DatabaseURL:  databaseURL,
		TransportURL: transportURL,
		AutoMigrate:  true,
		TablePrefix:  a.cfg.TablePrefix,
		HTTPAddr:     "", // no server
		Consumers:    a.cfg.Consumers,
		Defaults:     a.cfg.Defaults,
	}.WithDefaults()
	if a.cfg.Service != "" {
		if a.appCfg.Service, err = app.NewServiceSection(a.cfg.Service); err != nil {
			return fmt.Errorf("apptest: Config.Service: %w", err)
		}
	}
	if err := a.appCfg.Validate(); err != nil {
		return fmt.Errorf("apptest: %w", err)
	}
	a.fx = app.New(
		module,
		fx.Replace(a.appCfg),
		fx.Supply(a.cfg.Logger),
		fx.Populate(&a.db, &a.store, &a.transport, &a.registry),
		// Router-level middleware wraps each consumer's whole chain: it
		// sees the outcome the chain reported. The crash hook goes on
		// the message inside it.
		fx.Invoke(func(r *runner.Runner) { r.AddMiddleware(a.outcomes.observe, crashHook(a.cfg.Crash)) }),
	)
	if err := a.fx.Err(); err != nil {
		return fmt.Errorf("apptest: build the application: %w", err)
	}
	startCtx, cancel := context.WithTimeout(ctx, a.fx.StartTimeout())
	defer cancel()
	if err := a.fx.Start(startCtx); err != nil {
		// fx rolls back a start whose hook failed, not one cut short by
		// its context: stop what started (a no-op after a rollback).
		stopCtx, cancelStop := context.WithTimeout(context.WithoutCancel(ctx), a.fx.StopTimeout())
		defer cancelStop()
		_ = a.fx.Stop(stopCtx) // the start's error is what matters
		return fmt.Errorf("apptest: start the application: %w", err)
	}
	return nil
}

// Close stops the application, as a SIGTERM would (attempts in flight
// roll back), then removes its database: the SQLite files, or the
// PostgreSQL schema. Calls after the first do nothing.
func (a *App) Close(ctx context.Context) error {
	stopCtx, cancel := context.WithTimeout(ctx, a.fx.StopTimeout())
	defer cancel()
	var errs []error
	if err := a.fx.Stop(stopCtx); err != nil {
		errs = append(errs, fmt.Errorf("apptest: stop the application: %w", err))
	}
	errs = append(errs, a.removeDatabase(ctx))
	return errors.Join(errs...)
}

// removeDatabase runs the undo steps, the last first, once.
func (a *App) removeDatabase(ctx context.Context) error {
	var errs []error
	for i := len(a.undo) - 1; i >= 0; i-- {
		errs = append(errs, a.undo[i](ctx))
	}
	a.undo = nil
	return errors.Join(errs...)
}

// DB returns the application's database, the one its handlers get: for
// the test's assertions. On PostgreSQL its connections use the test's
// schema; write queries with "?" and DB().Rebind to run them on both.
func (a *App) DB() *sqlx.DB { return a.db }

// Store returns the application's store: processed marks, delivery
// counts, dead letters (Store().DeadLetters), checkpoints.
func (a *App) Store() driver.Store { return a.store }

// Config returns the application's configuration, as the module sees it.
func (a *App) Config() app.Config { return a.appCfg }

// Results are what became of one published message, by consumer name.
type Results map[string]testkit.Result

// Publish publishes env through the application's transport to the topic
// of its type, as a producer would, and waits for the outcome at every
// consumer of the module that handles the type. It fails when env does
// not encode (use PublishBody for a body that breaks the wire format) or
// no consumer handles the type.
//
// Each call is a new message, even for the same event: publish an event
// twice to see the second copy recognised as a duplicate.
func (a *App) Publish(ctx context.Context, env framework.Envelope) (Results, error) {
	msg, err := framework.NewMessage(env)
	if err != nil {
		return nil, fmt.Errorf("apptest: publish %s (use PublishBody to publish a malformed event): %w", env.Key(), err)
	}
	return a.publish(ctx, env.Type, msg)
}

// PublishBody publishes body as it is to topic, for poison, and waits for
// the outcome at every consumer of the module that handles topic (an
// event type).
func (a *App) PublishBody(ctx context.Context, topic string, body []byte) (Results, error) {
	return a.publish(ctx, topic, bodyMessage(body))
}

// Deliver sends env to one consumer alone, the way an operator's replay
// reaches it (driver.Transport.Replay: the consumer's replay topic, its queue
// on RabbitMQ), and waits for its outcome. Its dead letters carry the
// replay topic.
func (a *App) Deliver(ctx context.Context, consumer string, env framework.Envelope) (testkit.Result, error) {
	msg, err := framework.NewMessage(env)
	if err != nil {
		return testkit.Result{}, fmt.Errorf("apptest: deliver %s (use DeliverBody to deliver a malformed event): %w", env.Key(), err)
	}
	return a.deliver(ctx, consumer, msg)
}

// DeliverBody sends body as it is to one consumer alone (see Deliver) and
// waits for its outcome.
func (a *App) DeliverBody(ctx context.Context, consumer string, body []byte) (testkit.Result, error) {
	return a.deliver(ctx, consumer, bodyMessage(body))
}

// Await waits for the outcome at consumer of a message the test did not
// send itself through Publish or Deliver, carrying the event key: an
// event the outbox relay published, or a redelivery of a message first
// nacked. Outcomes that came before the call are kept for it, oldest
// first. The key of a body that is not a CloudEvent is
// framework.BodyKey(body).
func (a *App) Await(ctx context.Context, consumer string, key framework.Key) (testkit.Result, error) {
	if err := a.checkConsumer(consumer); err != nil {
		return testkit.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.OutcomeTimeout)
	defer cancel()
	res, err := a.outcomes.await(ctx, eventWait{consumer: consumer, key: key})
	if err != nil {
		return testkit.Result{}, fmt.Errorf("apptest: no outcome of event %s at %s: %w", key, consumer, err)
	}
	return res, nil
}

func (a *App) publish(ctx context.Context, topic string, msg *message.Message) (Results, error) {
	var consumers []string
	for _, c := range a.registry.Consumers() {
		if slices.Contains(c.Types(), topic) {
			consumers = append(consumers, c.Name())
		}
	}
	if len(consumers) == 0 {
		return nil, fmt.Errorf("apptest: publish to %s: no consumer of the module handles it", topic)
	}
	return a.send(ctx, msg, consumers, func() error {
		msg.SetContext(ctx)
		return a.transport.Publisher().Publish(topic, msg)
	})
}

func (a *App) deliver(ctx context.Context, consumer string, msg *message.Message) (testkit.Result, error) {
	if err := a.checkConsumer(consumer); err != nil {
		return testkit.Result{}, err
	}
	rs, err := a.send(ctx, msg, []string{consumer}, func() error {
		return a.transport.Replay(ctx, consumer, msg)
	})
	if err != nil {
		return testkit.Result{}, err
	}
	return rs[consumer], nil
}

// send gives msg a UUID of its own, expects an outcome of it at each of
// consumers, sends it and waits for the outcomes.
func (a *App) send(ctx context.Context, msg *message.Message, consumers []string, send func() error) (Results, error) {
	msg.UUID = watermill.NewUUID()
	waits := a.outcomes.expect(msg.UUID, consumers)
	defer a.outcomes.forget(msg.UUID, consumers)
	if err := send(); err != nil {
		return nil, fmt.Errorf("apptest: send message %s: %w", msg.UUID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.OutcomeTimeout)
	defer cancel()
	rs := make(Results, len(consumers))
	for _, c := range consumers {
		select {
		case o := <-waits[c]:
			if o.err != nil {
				return nil, fmt.Errorf("apptest: message %s at %s: %w", msg.UUID, c, o.err)
			}
			rs[c] = o.res
		case <-ctx.Done():
			return nil, fmt.Errorf("apptest: no outcome of message %s at %s: %w", msg.UUID, c, context.Cause(ctx))
		}
	}
	return rs, nil
}

func (a *App) checkConsumer(name string) error {
	for _, c := range a.registry.Consumers() {
		if c.Name() == name {
			return nil
		}
	}
	return fmt.Errorf("apptest: the module declares no consumer %s", name)
}

// crashHook returns a router middleware that puts h, when set, on the
// context of each message.
func crashHook(h testkit.CrashHook) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		if h == nil {
			return next
		}
		return func(msg *message.Message) ([]*message.Message, error) {
			msg.SetContext(testkit.WithCrashHook(msg.Context(), h))
			return next(msg)
		}
	}
}

// bodyMessage returns a message of body, with the content type the
// framework's publishers set.
func bodyMessage(body []byte) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), body)
	msg.Metadata.Set(framework.MetadataContentType, framework.ContentType)
	return msg
}
