package faults_test

import (
	"context"
	"log/slog"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/middleware"
)

// placedV1 is the load: an order placed. Its consumer, partitioned,
// records the effect and adds a shippedV1 to the outbox in the same
// transaction, which the outbox relay publishes to the second consumer.
type placedV1 struct {
	Order int `json:"order" validate:"required"`
}

type shippedV1 struct {
	Order int `json:"order" validate:"required"`
}

// migrations are the test service's own: one row per effect, stamped
// when it was written.
var migrations = app.Migrations{FS: fstest.MapFS{
	"00001_effects.sql": {Data: []byte(`-- +goose Up
CREATE TABLE effects (consumer TEXT NOT NULL, event_id TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());

-- +goose Down
DROP TABLE effects;
`)},
}}

// service is what every instance of a rig runs: two event types and two
// consumers, named after the rig's id so that the rigs running beside
// each other share nothing.
type service struct {
	placed      framework.Definition[placedV1]
	shipped     framework.Definition[shippedV1]
	place, ship string // the consumers' names
}

func newService(id string) service {
	return service{
		placed:  framework.Define[placedV1]("f"+id+".order.placed", 1),
		shipped: framework.Define[shippedV1]("f"+id+".order.shipped", 1),
		place:   "faults.place-" + id,
		ship:    "faults.ship-" + id,
	}
}

// config returns the service's configuration on spec's transport and
// servers (the proxies' addresses).
func (s service) config(spec childSpec) (app.Config, error) {
	cfg, err := app.LoadConfig(func(string) (string, bool) { return "", false })
	if err != nil {
		return app.Config{}, err
	}
	cfg.Transport = spec.Transport
	cfg.DatabaseURL = spec.DatabaseURL
	cfg.AMQPURL = spec.AMQPURL
	if spec.Transport == app.TransportPostgres {
		cfg.TransportURL = spec.DatabaseURL
	}
	cfg.AutoMigrate = true
	cfg.HTTPAddr = ""
	cfg.PurgeInterval = app.Duration(time.Second)
	cfg.OutboxRetention = app.Duration(time.Minute)
	cfg.Consumers = map[string]middleware.Settings{s.place: {Partitions: 4}}
	// Short attempts, few of them: an outage charged to the events
	// would dead-letter them within seconds.
	cfg.Defaults = middleware.Settings{Attempts: 2, Timeout: 10 * time.Second, RetryDelay: 50 * time.Millisecond}
	return cfg, nil
}

// module is an instance's application: the two consumers, cfg, logger,
// and hook at every crash point of the consumers and the relays (nil:
// none).
func (s service) module(cfg app.Config, logger *slog.Logger, hook crash.Hook) fx.Option {
	opts := []fx.Option{
		handlers.Register(s.place, handlers.On(s.placed, s.newPlace)),
		handlers.Register(s.ship, handlers.On(s.shipped, s.newShip)),
		fx.Supply(migrations),
		fx.Supply(logger),
		fx.Replace(cfg),
	}
	if hook != nil {
		opts = append(opts,
			fx.Supply(crash.Relays{Hook: hook}),
			fx.Invoke(func(rn *runner.Runner) {
				rn.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
					return func(msg *message.Message) ([]*message.Message, error) {
						msg.SetContext(crash.With(msg.Context(), hook))
						return next(msg)
					}
				})
			}))
	}
	return fx.Options(opts...)
}

// newPlace is the partitioned consumer's handler: an effect, and a
// follow-up event in the outbox, in the attempt's transaction.
func (s service) newPlace(db *sqlx.DB, box *outbox.Outbox) framework.HandlerFunc[placedV1] {
	return func(ctx context.Context, ev framework.Event[placedV1]) error {
		if _, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO effects (consumer, event_id) VALUES ($1, $2)`, s.place, ev.ID); err != nil {
			return err
		}
		env, err := s.shipped.Envelope(shippedV1(ev.Data), framework.Attributes{ID: "shipped/" + ev.ID, Source: "faults.place", CorrelationID: ev.ID})
		if err != nil {
			return err
		}
		return box.Add(ctx, env)
	}
}

// newShip is the follow-up's consumer: an effect.
func (s service) newShip(db *sqlx.DB) framework.HandlerFunc[shippedV1] {
	return func(ctx context.Context, ev framework.Event[shippedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO effects (consumer, event_id) VALUES ($1, $2)`, s.ship, ev.ID)
		return err
	}
}
