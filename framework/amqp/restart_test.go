package amqp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestBrokerRestart restarts a private RabbitMQ node while a subscriber
// drains a backlog, then boots a connection while the node is down: the
// subscriber recovers by itself, nothing is lost, the
// connection is established once the node is back, and Connected says
// the truth meanwhile.
//
// watermill-amqp v3.0.2 (the latest) reassigns its connected channel
// without a lock when the connection drops, which the race detector
// reports from its own goroutines. Under -race this test therefore runs
// itself again in a child `go test` without -race; everything else in the
// package runs with -race.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled {
		testenv.Require(t, testenv.AMQPURLVar)
		testserver.RerunWithoutRace(t, "TestBrokerRestart")
		return
	}
	n := testserver.StartRabbitMQ(t)
	cfg := TransportConfig{NackDelay: 50 * time.Millisecond, MaxNackDelay: 500 * time.Millisecond}

	t.Run("WhileDraining", func(t *testing.T) {
		env := amqpEnv(t, n.URL, cfg)
		env.Timeout = 90 * time.Second
		transporttest.ExerciseServerRestart(t, env, func(t *testing.T) {
			n.Stop(t)
			time.Sleep(500 * time.Millisecond)
			n.Start(t)
		})
	})

	t.Run("DownAtBoot", func(t *testing.T) {
		watching := connect(t, TransportConfig{URL: n.URL})
		n.Stop(t)
		require.Eventually(t, func() bool { return !watching.Connected() }, 10*time.Second, 50*time.Millisecond,
			"Connected reports the lost connection")

		conn, err := newConnection(TransportConfig{URL: n.URL, ConnectInterval: 100 * time.Millisecond, MaxConnectInterval: 500 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		pub, err := newPublisher(conn)
		require.NoError(t, err)
		defer pub.Close()
		require.ErrorIs(t, pub.Publish("t", message.NewMessage("1", nil)), ErrNotConnected)
		require.False(t, conn.Connected())

		connected := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			connected <- conn.Connect(ctx)
		}()
		time.Sleep(time.Second) // a few failed attempts
		n.Start(t)
		require.NoError(t, <-connected)
		require.True(t, conn.Connected())
		require.Eventually(t, watching.Connected, 30*time.Second, 100*time.Millisecond,
			"watermill-amqp reconnects by itself")
	})
}

// TestConnectGivesUpWithContext: with no broker at all, Connect retries
// until its context ends and says so.
func TestConnectGivesUpWithContext(t *testing.T) {
	t.Parallel()
	conn, err := newConnection(TransportConfig{URL: "amqp://guest:guest@127.0.0.1:1/", ConnectInterval: 50 * time.Millisecond, MaxConnectInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = conn.Connect(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "attempts")
	require.False(t, conn.Connected())
	require.NoError(t, conn.Close())
	require.True(t, errors.Is(conn.Connect(context.Background()), ErrClosed))
}
