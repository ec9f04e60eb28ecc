// Package app runs a consumer service: it loads the configuration, opens
// the database, applies migrations, builds the transport and watermill's
// router with every consumer declared through package handlers, serves
// health, readiness and metrics, and stops gracefully.
//
// # A service in one file
//
//	func main() {
//		app.Main("notifications", fx.Options(
//			handlers.Register("notifications.remind-on-appointment-booked",
//				handlers.On(appointments.Booked, NewRemindOnBooked),
//			),
//			fx.Supply(app.Migrations{FS: migrations}),
//		))
//	}
//
// The command has the subcommands serve (consume until SIGINT or SIGTERM),
// migrate (apply the framework's migrations and the service's own) and
// dead-letters, the operator's tools:
//
//	notifications dead-letters list [--consumer C] [--code X] [--status pending|replayed|discarded|all]
//	notifications dead-letters show 42
//	notifications dead-letters replay 42 43 --reason "the mail server is back"
//	notifications dead-letters replay --consumer C --code X [--since T] [--dry-run] [--rate N] --reason "..."
//	notifications dead-letters discard 44 --reason "test data"
//	notifications dead-letters parked [--consumer C] [--subject S]
//	notifications dead-letters discard 45 --release-parked --reason "superseded"
//
// The commands need only the database. A replay is recorded with the dead
// letter's mark, in one transaction, and the running service publishes it
// to the dead letter's consumer alone (its queue on amqp, its replay topic
// on the SQL transports), which handles it afresh; show prints the dead
// letter's history, every failure and resolution. Under strict_order the
// later events of a dead letter's subject are parked behind it (parked
// lists them): a replay applies them after it; a discard keeps them
// parked unless --release-parked.
//
// Two views, both with --json, read the database alone: events show
// SOURCE ID, what happened to one event (produced, applied, dead-lettered,
// parked, or its record purged before a time), and consumers, every
// declared consumer with its settings and figures:
//
//	notifications events show appointments 7f3c2a
//	notifications consumers
//
// One purge deletes what is past its retention (processed_retention,
// outbox_retention, replay_retention, dead_letter_retention, the
// delivery counts of messages that finished, and on the postgres
// transport the messages every consumer group passed, older than
// transport_retention), in batches, one process of
// the service at a time: the service runs it every purge_interval, and
// the purge command once (--dry-run prints what it would delete):
//
//	notifications purge --dry-run
//
// The same work can be done in the browser: with console.enabled
// (EFFECTIVELY_CONSOLE=true) and tokens (EFFECTIVELY_CONSOLE_TOKENS, each
// name:secret:read or name:secret:write), the service serves the operator
// console of package console under /console/ on its HTTP address
// (docs/operations.md, Console).
//
// # Configuration
//
// Environment variables set the common settings; the YAML file named by
// EFFECTIVELY_CONFIG may set the same keys and per-consumer settings:
//
//	transport: sqlite
//	database_url: file:./data/notifications.db
//	processed_retention: 720h # purge processed marks after 30 days (default: keep)
//	defaults:
//	  attempts: 3
//	  retry_delay: 1s
//	  timeout: 30s
//	consumers:
//	  notifications.remind-on-appointment-booked:
//	    attempts: 5
//	    concurrency: 4
//	    rate_limit: 50
//	    max_deliveries: 10
//	    skip_stale: true # events older than their subject's latest are skipped
//	    batch_size: 1    # a transaction per attempt (default: up to 32 share one)
//	    overlap: 8       # at most 8 attempts at once while handlers wait outside (default 32)
//	    breaker: {failures: 5, cool_down: 30s, max_hold: 1m} # see below
//	  projections.appointment-history:
//	    strict_order: true # each subject's events in sequence; a gap waits
//	    gap_timeout: 5m    # then sequence_gap
//
// breaker is the consumer's circuit breaker, off by default: after
// failures failed attempts in a row of a dependency (errors the handler
// wraps with framework.Dependency; any_error: true counts every
// non-permanent error) the consumer stops taking new messages; they wait,
// uncounted, up to max_hold (default 1m, at most 10m), then come back
// later; after cool_down (default 30s) one probe attempt goes through, and
// its success closes the breaker (see middleware.BreakerConfig).
//
// A consumer's keys are those of middleware.Settings (max_body_bytes too),
// the type that Config.Consumers and Config.Defaults hold, and that the
// runner and the test kits take: Config.Settings returns a consumer's,
// merged with the defaults: section.
//
// Environment variables win over the file. A bad value stops start-up with
// an error naming its key, and so does a name under consumers: that no
// declared consumer has (a name given to handlers.RenamedFrom is allowed).
// With no configuration at all the service runs on one SQLite file,
// ./data/effectively.db.
//
// # The service's own settings
//
// A service keeps its own settings in the same file, under service:, a
// section the framework leaves to it:
//
//	service:
//	  smtp:
//	    host: mail.example.com
//	    port: 2525
//	  reminder_lead: 24h
//
// and decodes it into a struct of its own, whose yaml tags name the keys:
//
//	type Settings struct {
//		SMTP struct {
//			Host string `yaml:"host"`
//			Port int    `yaml:"port"`
//		} `yaml:"smtp"`
//		ReminderLead app.Duration `yaml:"reminder_lead"`
//	}
//
//	fx.Provide(app.ServiceConfig[Settings])
//
// or, to start from defaults, with Config.DecodeService:
//
//	fx.Provide(func(cfg app.Config) (Settings, error) {
//		s := Settings{ReminderLead: app.Duration(time.Hour)}
//		err := cfg.DecodeService(&s)
//		return s, err
//	})
//
// (ExampleConfig_DecodeService runs it.)
//
// A key the struct has no field for, or a bad value, is an error naming it
// (service.smtp.port, with its line). The service's own checks of the
// values should name their keys the same way. A service: section that
// none of the service's constructors decoded stops New (its Err): its
// settings would be ignored.
//
// # Migrations
//
// The migrate command applies the framework's migrations and the
// service's own (fx.Supply(app.Migrations{FS: ...})); with
// EFFECTIVELY_AUTO_MIGRATE=true the service applies them at start.
// Otherwise the service refuses to start on a database that lacks one of
// them, saying so: "database schema is at version 0, this binary needs 1:
// run `notifications migrate` or set EFFECTIVELY_AUTO_MIGRATE=true". A
// database ahead of the binary, migrated by a newer release during a
// rolling deploy, is fine. The SQL transports create their own tables, in
// EFFECTIVELY_TRANSPORT_URL's database too, and need no migration.
//
// # Middleware of the service's own
//
// fx.Supply(app.Middleware{Outer: ..., Inner: ...}) puts the service's
// watermill middleware in every consumer's chain: Outer once per delivery
// with the decoded event, outside the retries and the transaction; Inner
// in each attempt's transaction. ExampleMiddleware shows both.
//
// # Metrics of the service's own
//
// The application serves one Prometheus registry on /metrics (never the
// global one): the framework's metrics, the Go runtime's and the
// process's. A service adds its own collectors to it through the
// prometheus.Registerer that Module provides:
//
//	fx.Invoke(func(reg prometheus.Registerer) error {
//		return reg.Register(remindersSent)
//	})
//
// Module provides the same registry as a prometheus.Gatherer, to read what
// it holds. Example_metrics runs it.
//
// # What is where
//
// Package app is the fx wiring around the engine: the configuration
// (config*.go), the database and store (database.go), the transport
// (transport.go), the runner and the outbox (router.go, outbox.go), the
// HTTP server of health, readiness, metrics and the console (http.go,
// console.go), tracing, logging, and the application's build, start and
// stop (module.go, serve.go), with the command line's entry points
// (command.go). The engine loops (the consumers, the relays, the purge,
// the gauges) are package app/runner's; the purge's steps are
// app/internal/purge's. The operator's commands are app/internal/cli's:
// app gives them the service as plain values (how to serve it, migrate
// it, and build it without starting it to open its database), so that
// they never see fx.
//
// # Start and shutdown
//
// The consumers run in a runner.Runner, which works without fx too. At
// start it subscribes every handler before any message is handled. On
// SIGINT or SIGTERM it takes no new message and starts no new attempt (a
// message waiting for its retry is nacked, its delivery not charged), lets
// the attempts in flight finish within half of the stop timeout, then
// cancels the rest: they roll back, mark included, and their messages are
// not acknowledged, so they are delivered again later. Nothing is
// acknowledged before its effect committed. A signal during the start
// ends it (a broker still awaited, subscriptions still pending), rolls
// back what started, and Serve returns nil; so does one while the serve
// command still opens its database or migrates it (the migration rolls
// back).
package app
