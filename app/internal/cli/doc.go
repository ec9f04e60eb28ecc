// Package cli is the operator's command line of a service built with
// package app: the root command and its subcommands serve, migrate,
// dead-letters (list, show, replay, discard, parked), events show,
// consumers and purge, which app.Command and app.Main return and run.
//
// Package app imports it, so it does not import app: what it needs of the
// service comes as a Service, which app fills from the service's fx
// options. Serve and Migrate run the service's serve and migrate
// commands; Open builds the service's application without starting it
// and opens its database, for the operator's commands, which work with
// the Database it returns alone: the store, the declared consumers, and
// the few settings they print or respect (Config). The command line
// never sees fx, and app never sees the commands' flags and output.
//
// Where is what: cli.go (the root, usage errors), operator.go (what the
// operator's commands work with), deadletters.go (list, show),
// replay.go (replay, and the verdict of each dead letter; its rate and
// time range are package bulk's), throttle.go
// (the progress bar), discard.go (discard, parked),
// events.go (events show), consumers.go (consumers), purge.go (purge),
// print.go (the tables and escapes every command prints with) and
// console.go (what the operator console shares with the commands).
package cli
