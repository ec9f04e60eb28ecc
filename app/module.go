package app

import (
	"fmt"
	"os"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/handlers"
)

// Module is the framework's fx application: the configuration (from the
// environment, see LoadConfig), the database and its store, the transport,
// the router running every consumer declared with handlers.Register, the
// outbox (*outbox.Outbox, for handlers) and its relay, the relay of the
// replays operators record (dead-letters replay), the purge of what is
// past its retention, and the HTTP server of health, readiness and
// metrics (with the gauges of pending dead letters and parked events read
// from the database, and the counters of replays and discards).
// Besides the configuration and the outbox, it provides the database
// (*sqlx.DB), its store (driver.Store), the transport
// (driver.Transport), the consumers' metrics (*middleware.Metrics), and
// the registry served on /metrics as a prometheus.Registerer, on which a
// service registers collectors of its own, and a prometheus.Gatherer.
//
// It does not provide a *slog.Logger: without one, warnings and errors go
// to stderr (see DefaultLogger); supply one to choose. Replace the
// configuration with fx.Replace(cfg): its zero fields take their defaults
// (Config.WithDefaults) and it is checked as LoadConfig checks one, a bad
// setting stopping start-up with an error that names its key.
//
// The consumers and the outbox relay trace with OpenTelemetry. Supply a
// trace.TracerProvider to choose it (as a trace.TracerProvider, e.g. with
// fx.Annotate and fx.As): the app then uses it and leaves its
// configuration, shutdown and OpenTelemetry's globals to its owner.
// Without one, the app configures OpenTelemetry from the standard OTEL_*
// environment variables, traces off unless OTEL_TRACES_EXPORTER names an
// exporter (docs/operations.md, Tracing).
var Module = fx.Module("effectively",
	fx.Provide(
		ConfigFromEnv,
		newMember,
		newTracer,
		newDB,
		newStore,
		newTransport,
		newMetrics,
		newResolutions,
		newRouter,
		newHTTP,
		newOutbox,
		relayCrash,
		func() *readiness { return &readiness{} },
	),
	handlers.Module,
	// A configuration given in code (fx.Replace) is checked as one loaded
	// from the environment is: a bad one stops start-up naming its key.
	fx.Decorate(checkedConfig),
	// The CPU profile, when asked for, starts before anything opens and
	// stops after everything closed.
	fx.Invoke(profileCPU),
	// Settings for a consumer that is not declared are refused before
	// anything is opened.
	fx.Invoke(func(p consumerSettings) error { return p.Config.checkConsumers(p.Declarations) }),
	// The server and the runner (the consumers, the relays, the purge:
	// see runner.Runner's Start and Stop) start with the application, in
	// this order (fx starts hooks in the order their constructors ran,
	// and stops them in reverse): the HTTP address is bound before any
	// consumer takes a message, so that an address in use stops the
	// start before anything was handled, and it serves /metrics until the
	// runner has stopped.
	fx.Invoke(func(*httpServer, *runner.Runner) {}),
)

// consumerSettings is what the check of the consumers: keys takes from fx:
// the declarations, which build no handler.
type consumerSettings struct {
	fx.In

	Config       Config
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// checkedConfig is cfg with its defaults, once Validate accepts it.
func checkedConfig(cfg Config) (Config, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// ConfigFromEnv loads the configuration from the process environment.
func ConfigFromEnv() (Config, error) { return LoadConfig(os.LookupEnv) }
