// Package faults holds the network fault tests: the real service, on
// RabbitMQ and PostgreSQL or on the PostgreSQL transport, with its
// outbox relay and its purge running and a partitioned consumer on
// several instances (the first in the test's process, each other one in
// a process of its own), under steady load, with every connection it makes
// to PostgreSQL and RabbitMQ going through a Toxiproxy proxy run inside
// the test process. Each test injects one fault (latency, a bandwidth of
// a few kB/s, connections reset mid-stream or mid-commit, a black hole),
// removes it, and checks that every event took effect once, none was
// dead-lettered, consumption resumed within 10 s of the fault's end, and
// no connection was left behind. TestPartitionedRelayClaim cuts an
// outbox relay alone off from PostgreSQL while it holds a batch's claim.
//
// It is a module of its own so that Toxiproxy stays out of the
// framework's go.mod; make test runs it (docs/reliability.md lists what
// it measures).
package faults
