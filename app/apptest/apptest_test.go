package apptest_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// A shop service: one consumer confirms placed orders and, through the
// outbox it gets from fx, publishes a follow-up event that a second
// consumer records.

type PlacedV1 struct {
	OrderID string `json:"orderId" validate:"required"`
}

type ConfirmedV1 struct {
	OrderID string `json:"orderId" validate:"required"`
}

var (
	Placed    = framework.Define[PlacedV1]("shop.order.placed", 1)
	Confirmed = framework.Define[ConfirmedV1]("shop.order.confirmed", 1)
)

const (
	confirmer = "shop.confirm-order"
	recorder  = "shop.record-confirmation"
)

var shopMigrations = fstest.MapFS{"00001_confirmations.sql": {Data: []byte(`-- +goose Up
CREATE TABLE confirmations (order_id TEXT PRIMARY KEY);
-- +goose Down
DROP TABLE confirmations;
`)}}

// newConfirm needs the application's outbox: a test kit that does not run
// the module's own fx wiring cannot build it.
func newConfirm(box *outbox.Outbox) framework.HandlerFunc[PlacedV1] {
	return func(ctx context.Context, ev framework.Event[PlacedV1]) error {
		env, err := Confirmed.Envelope(ConfirmedV1{OrderID: ev.Data.OrderID}, framework.Attributes{
			ID:     framework.FollowUpID(ev.Key(), "confirmed"),
			Source: "shop",
		})
		if err != nil {
			return err
		}
		return box.Add(ctx, env)
	}
}

func newRecord(db *sqlx.DB) framework.HandlerFunc[ConfirmedV1] {
	insert := db.Rebind(`INSERT INTO confirmations (order_id) VALUES (?)`)
	return func(ctx context.Context, ev framework.Event[ConfirmedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, ev.Data.OrderID)
		return err
	}
}

var shopModule = fx.Options(
	handlers.Register(confirmer, handlers.On(Placed, newConfirm)),
	handlers.Register(recorder, handlers.On(Confirmed, newRecord)),
	fx.Supply(app.Migrations{FS: shopMigrations}),
)

// TestOutbox runs a module whose handler takes *outbox.Outbox from fx, on
// every database and transport the kit offers: the follow-up event it
// adds is relayed after the commit and handled by the second consumer,
// once however often the first event is delivered.
func TestOutbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) apptest.Config
	}{
		{"SQLite", func(*testing.T) apptest.Config { return apptest.Config{} }},
		{"Memory", func(*testing.T) apptest.Config { return apptest.Config{Transport: app.TransportMemory} }},
		{"Postgres", func(t *testing.T) apptest.Config {
			return apptest.Config{PostgresURL: testenv.Require(t, testenv.PostgresURLVar)}
		}},
		{"PostgresMemory", func(t *testing.T) apptest.Config {
			return apptest.Config{PostgresURL: testenv.Require(t, testenv.PostgresURLVar), Transport: app.TransportMemory}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			svc := apptest.New(t, shopModule, tc.cfg(t))

			env := testkit.Envelope(t, Placed, PlacedV1{OrderID: "o-1"}, framework.Attributes{})
			res, err := svc.Publish(ctx, env)
			require.NoError(t, err)
			require.Len(t, res, 1, "only the confirmer handles placed orders")
			testkit.RequireProcessed(t, res[confirmer])

			followUp := framework.Key{Source: "shop", ID: framework.FollowUpID(env.Key(), "confirmed")}
			got, err := svc.Await(ctx, recorder, followUp)
			require.NoError(t, err)
			testkit.RequireProcessed(t, got)

			res, err = svc.Publish(ctx, env)
			require.NoError(t, err)
			testkit.RequireDuplicate(t, res[confirmer])

			var n int
			require.NoError(t, svc.DB().GetContext(ctx, &n, `SELECT count(*) FROM confirmations`))
			require.Equal(t, 1, n)
		})
	}
}

// TestMiddleware shows that the module's app.Middleware runs in every
// consumer's chain: an inner middleware's permanent error dead-letters the
// message with its code.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reject := app.Middleware{Inner: []message.HandlerMiddleware{
		func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				if d, ok := framework.EnvelopeFromContext(msg.Context()); ok && d.Subject == "blocked" {
					return nil, framework.Permanent("blocked_customer", errors.New("blocked"))
				}
				return next(msg)
			}
		},
	}}
	svc := apptest.New(t, fx.Options(shopModule, fx.Supply(reject)), apptest.Config{})

	blocked := testkit.Envelope(t, Placed, PlacedV1{OrderID: "o-2"}, framework.Attributes{Subject: "blocked"})
	res, err := svc.Publish(ctx, blocked)
	require.NoError(t, err)
	testkit.RequireDeadLettered(t, res[confirmer], "blocked_customer")

	fine := testkit.Envelope(t, Placed, PlacedV1{OrderID: "o-3"}, framework.Attributes{})
	res, err = svc.Publish(ctx, fine)
	require.NoError(t, err)
	testkit.RequireProcessed(t, res[confirmer])
}

// TestDeliver sends messages to one consumer alone, as a replay does: the
// other consumers of the type see nothing, and the dead letter names the
// replay topic.
func TestDeliver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	seen := make(chan string, 10)
	other := handlers.Register("shop.audit", handlers.On(Placed, func(_ context.Context, ev framework.Event[PlacedV1]) error {
		seen <- ev.ID
		return nil
	}))
	svc := apptest.New(t, fx.Options(shopModule, other), apptest.Config{})

	env := testkit.Envelope(t, Placed, PlacedV1{OrderID: "o-4"}, framework.Attributes{ID: "placed-4"})
	res, err := svc.Deliver(ctx, confirmer, env)
	require.NoError(t, err)
	testkit.RequireProcessed(t, res)

	res, err = svc.DeliverBody(ctx, confirmer, []byte("not an event"))
	require.NoError(t, err)
	testkit.RequireDeadLettered(t, res, framework.CodeMalformedEnvelope)
	dls, err := svc.Store().DeadLetters(ctx, driver.DeadLetterFilter{Consumer: confirmer})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, pipeline.ReplayTopic(confirmer), dls[0].Topic)

	// Published, the event reaches both consumers: the audit sees it only
	// now, and the confirmer finds it processed.
	rs, err := svc.Publish(ctx, env)
	require.NoError(t, err)
	testkit.RequireDuplicate(t, rs[confirmer])
	testkit.RequireProcessed(t, rs["shop.audit"])
	require.Equal(t, "placed-4", <-seen)
	require.Empty(t, seen)
}

// TestMissingDependency: a handler whose constructor needs something the
// module does not provide stops the start, naming the type, as it would
// stop the service.
func TestMissingDependency(t *testing.T) {
	t.Parallel()
	type Mailer struct{}
	module := handlers.Register(confirmer, handlers.On(Placed, func(*Mailer) framework.HandlerFunc[PlacedV1] {
		return func(context.Context, framework.Event[PlacedV1]) error { return nil }
	}))
	_, err := apptest.Start(t.Context(), module, apptest.Config{})
	require.ErrorContains(t, err, "apptest_test.Mailer")
}

// TestClose: Close stops the application and removes its database; a
// second Close (the test's cleanup after the test's own) changes nothing.
func TestClose(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	svc := apptest.New(t, shopModule, apptest.Config{})
	dir := filepath.Dir(svc.Config().DatabaseURL)
	require.FileExists(t, filepath.Join(dir, apptest.DatabaseFile))
	require.NoError(t, svc.Close(ctx))
	require.NoDirExists(t, dir)
	require.NoError(t, svc.Close(ctx))
}

// TestLogger: the application logs to the kit's logger, here a dead
// letter at warn level with its code.
func TestLogger(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	svc := apptest.New(t, shopModule, apptest.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	res, err := svc.DeliverBody(t.Context(), confirmer, []byte("not an event"))
	require.NoError(t, err)
	testkit.RequireDeadLettered(t, res, framework.CodeMalformedEnvelope)
	require.Contains(t, logs.String(), "code=malformed_envelope")
}

// syncBuffer is a bytes.Buffer for writers in several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestEnvironmentIgnored: the application's configuration is the kit's,
// whatever the environment says.
func TestEnvironmentIgnored(t *testing.T) {
	t.Setenv(app.EnvConfig, "/nonexistent/effectively.yaml")
	t.Setenv(app.EnvTransport, "amqp")
	svc := apptest.New(t, shopModule, apptest.Config{})
	require.Equal(t, app.TransportSQLite, svc.Config().Transport)
	require.Empty(t, svc.Config().HTTPAddr)
}

// TestErrors: what the kit refuses, with the reason.
func TestErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, err := apptest.Start(ctx, shopModule, apptest.Config{Transport: app.TransportAMQP})
	require.ErrorContains(t, err, "Transport")
	_, err = apptest.Start(ctx, shopModule, apptest.Config{PostgresURL: "host=db"})
	require.ErrorContains(t, err, "postgres://")

	svc := apptest.New(t, shopModule, apptest.Config{})
	_, err = svc.PublishBody(ctx, "shop.order.cancelled", []byte("{}"))
	require.ErrorContains(t, err, "no consumer of the module handles it")
	_, err = svc.DeliverBody(ctx, "shop.unknown", []byte("{}"))
	require.ErrorContains(t, err, "declares no consumer shop.unknown")
	_, err = svc.Deliver(ctx, confirmer, framework.Envelope{})
	require.ErrorContains(t, err, "DeliverBody")
}

// TestMaxBodyBytes: a consumer's max_body_bytes (middleware.Settings, as
// in the YAML's consumers: entries) reaches its chain through the
// application and the runner: a body over it is dead-lettered too_large,
// in that consumer only.
func TestMaxBodyBytes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	svc := apptest.New(t, shopModule, apptest.Config{
		Consumers: map[string]middleware.Settings{confirmer: {MaxBodyBytes: 64}},
	})
	env := testkit.Envelope(t, Placed, PlacedV1{OrderID: "o-" + strings.Repeat("9", 100)}, framework.Attributes{})
	res, err := svc.Deliver(ctx, confirmer, env)
	require.NoError(t, err)
	testkit.RequireDeadLettered(t, res, framework.CodeTooLarge)
	res, err = svc.Deliver(ctx, recorder, testkit.Envelope(t, Confirmed, ConfirmedV1{OrderID: "o-" + strings.Repeat("9", 100)}, framework.Attributes{}))
	require.NoError(t, err)
	testkit.RequireProcessed(t, res)
}

// TestConfigService: the kit's service: section reaches the module as the
// file's would; a key the service's settings do not have, or YAML that is
// not a mapping, stops the start naming it, as does a section that the
// module does not decode.
func TestConfigService(t *testing.T) {
	t.Parallel()
	type settings struct {
		Paused []string `yaml:"paused_sources"`
	}
	var got settings
	decodes := fx.Options(fx.Provide(app.ServiceConfig[settings]), fx.Populate(&got), shopModule)
	svc := apptest.New(t, decodes, apptest.Config{Service: "paused_sources: [a, b]\n"})
	require.Equal(t, []string{"a", "b"}, got.Paused)
	require.NoError(t, svc.Close(t.Context()))

	for yaml, want := range map[string]string{
		"paused_source: [a]\n": `service.paused_source (line 2): field paused_source not found`,
		"- a\n":                `apptest: Config.Service: service: want a mapping`,
	} {
		_, err := apptest.Start(t.Context(), decodes, apptest.Config{Service: yaml})
		require.ErrorContains(t, err, want, yaml)
	}
	_, err := apptest.Start(t.Context(), shopModule, apptest.Config{Service: "paused_sources: [a]\n"})
	require.ErrorContains(t, err, "the service decodes no service: section")
}
