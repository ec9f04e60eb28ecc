package app

import (
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/handlers"
)

// Module is the framework's fx application: the configuration (from the
// environment, see LoadConfig), the database and its stores, the transport,
// the router running every consumer declared with handlers.Consumer, and
// the HTTP server of health, readiness and metrics.
//
// It does not provide a *slog.Logger: supply one to see logs. Replace the
// configuration with fx.Replace(cfg).
var Module = fx.Module("effectively",
	fx.Provide(
		ConfigFromEnv,
		NewDB,
		NewStores,
		NewTransport,
		NewMetrics,
		NewRouter,
		NewHTTP,
		func() *Readiness { return &Readiness{} },
	),
	handlers.Module,
	// The router and the server start with the application.
	fx.Invoke(func(*message.Router, *HTTP) {}),
)

// ConfigFromEnv loads the configuration from the process environment.
func ConfigFromEnv() (Config, error) { return LoadConfig(os.LookupEnv) }
