// Command notifications is the example service of effectively: it
// schedules a reminder for every booked appointment, exactly once.
//
//	notifications serve     consume until SIGINT or SIGTERM
//	notifications demo      publish demo events, handle them, print a summary
//	notifications migrate   apply the schema
//
// It runs on SQLite with no configuration; see the README for PostgreSQL.
package main

import "github.com/effectively-once/effectively/app"

func main() {
	app.Main("notifications", Module, demoCommand())
}
