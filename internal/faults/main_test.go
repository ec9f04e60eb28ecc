package faults_test

import (
	"os"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMain checks that no test leaks a goroutine. The ignores are
// watermill-amqp's and amqp091-go's, as in package app's TestMain: a
// connection closed while the broker is unreachable leaves its
// handleConnectionClose goroutine waiting for a reconnection that never
// comes, and a connection the broker drops while it closes blocks
// amqp091-go's shutdown on an unread channel (and with it that
// connection's reader and heartbeater).
//
// The last is Toxiproxy's (v2.5.0), which the tests run in-process: a
// link whose connection closed while a toxic was being added or removed
// leaves a stub of its chain (the noop toxic at its head) blocked on a
// send that no stage reads; the proxy is stopped and its connections
// are closed, nothing of the service's is held.
//
// With childVar set, the binary runs an instance of a rig's service
// instead (see runChild).
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(childVar); ok {
		os.Exit(runChild(spec))
	}
	// Toxiproxy's toxics log through zerolog's global logger, the
	// bandwidth toxic at every chunk; the tests log what they measure.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp.(*ConnectionWrapper).handleConnectionClose"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).shutdown"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/amqp091-go.(*Connection).reader"),
		goleak.IgnoreTopFunction("github.com/rabbitmq/amqp091-go.(*Connection).heartbeater"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
	)
}
