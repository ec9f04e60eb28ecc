// Command notifications is the example service of effectively: it
// schedules a reminder for every booked appointment, exactly once.
//
//	notifications serve     consume until SIGINT or SIGTERM
//	notifications demo      publish demo events, handle them, print a summary
//	notifications migrate   apply the schema
//
// It runs on SQLite with no configuration; see the README for PostgreSQL.
// NOTIFICATIONS_OUTSIDE_WAIT=10ms makes its handler wait as one that calls
// an outside service would (the benchmark's outside-call scenario).
package main

import (
	"os"

	"github.com/effectively-once/effectively/app"
)

func main() {
	app.Main("notifications", serviceModule(os.Getenv(EnvOutsideWait)), demoCommand())
}
