// Package testserver starts servers of a test's own beside the shared
// ones, for the tests that restart a server under a running consumer: a
// PostgreSQL cluster (StartPostgres), a primary with a streaming standby
// for a failover (StartPair) and a RabbitMQ node (StartRabbitMQ), each on
// ports and in a folder of its own, run as the server's system
// user and removed when the test ends. They need the shared servers'
// installation: where it is not there the test is skipped (or fails under
// CI=true, see testenv.Missing).
//
// RerunWithoutRace runs a test again in a child `go test` built without
// the race detector, for the tests of a library that races on a broker
// restart by itself (watermill-amqp).
package testserver
