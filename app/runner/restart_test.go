package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner/runnertest"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestPostgresServerRestart restarts a private PostgreSQL cluster, which
// holds the stores and the transport, while a Runner drains a backlog:
// the subscriber and the stores reconnect by themselves, nothing is lost,
// nothing is applied twice.
func TestPostgresServerRestart(t *testing.T) {
	t.Parallel()
	c := testserver.StartPostgres(t)
	db, err := postgres.Open(context.Background(), c.URL, postgres.OpenConfig{MaxOpenConns: 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	tr, err := postgres.New(context.Background(), db, postgres.TransportConfig{URL: c.URL, PollInterval: 20 * time.Millisecond, ResendInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	env := &runnertest.Env{DB: db, Store: store, Env: transporttest.Env{Transport: tr, Timeout: 90 * time.Second}}
	runnertest.ExerciseServerRestart(t, env, func(t *testing.T) {
		c.Stop(t)
		time.Sleep(time.Second)
		c.Start(t)
	})
}

// TestAMQPBrokerRestart restarts a private RabbitMQ node while a Runner
// drains a backlog, the stores in the shared PostgreSQL: the consumer
// recovers by itself, nothing is lost, nothing is applied twice.
//
// watermill-amqp races on a dropped connection by itself (see
// framework/amqp's TestBrokerRestart): under -race this test runs itself
// again in a child `go test` without -race.
func TestAMQPBrokerRestart(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled {
		testenv.Require(t, testenv.AMQPURLVar)
		testserver.RerunWithoutRace(t, "TestAMQPBrokerRestart")
		return
	}
	n := testserver.StartRabbitMQ(t)
	db := testenv.Postgres(t)
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	tr, err := amqp.New(amqp.TransportConfig{URL: n.URL, NackDelay: 50 * time.Millisecond, MaxNackDelay: 500 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Connect(ctx); err != nil {
		_ = tr.Close()
		t.Fatalf("connect to the private node: %v", err)
	}
	env := &runnertest.Env{DB: db, Store: store, Env: transporttest.Env{Transport: tr, Timeout: 90 * time.Second}}
	runnertest.ExerciseServerRestart(t, env, func(t *testing.T) {
		n.Stop(t)
		time.Sleep(500 * time.Millisecond)
		n.Start(t)
	})
}
