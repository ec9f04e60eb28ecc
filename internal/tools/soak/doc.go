// Package soak is the soak behind make soak, and its short version in
// make test (TestSoak): a producer service writes a plan of events
// through the outbox, its relay publishes them to RabbitMQ, and two
// consumer processes handle them, killed with SIGKILL at random every few
// seconds and started again, while PostgreSQL restarts once and (make
// soak) a node of a three-node RabbitMQ cluster with quorum queues is
// killed and brought back. At the end the poison is discarded with
// dead-letters discard --release-parked and Report.Check requires every
// consumer's effects to equal the distinct events less the poison, each
// once, and nothing parked, pending or unsent.
//
// The plan (NewPlan) sends 5% of its events twice (a second publication
// outside the outbox), 1% are poison (a version no consumer knows), 2%
// fail their first attempt in each consumer, and each subject's ten
// events are written interleaved with other subjects', some neighbours
// swapped. Of the two consumers (ServiceModule, at the default
// configuration), soak.effects records one effect per event and
// soak.projection, under strict_order, keeps each subject's last sequence
// and refuses (code out_of_order) an event that does not follow the one
// it applied last.
//
// The servers are the soak's own: a PostgreSQL 15 server made by initdb
// as the postgres user on a free loopback port (StartPostgres), and, for
// make soak, three RabbitMQ nodes run as the rabbitmq user, joined in one
// cluster (RabbitNode); the short version uses the one node named by
// EFFECTIVELY_TEST_AMQP_URL. They need root (runuser).
package soak
