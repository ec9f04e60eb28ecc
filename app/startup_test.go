package app_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// serveAMQP serves the widget service on the broker at amqpURL, with
// startTimeout, and returns Serve's error.
func serveAMQP(t *testing.T, amqpURL string, startTimeout time.Duration) error {
	t.Helper()
	cfg := testConfig(t)
	cfg.Transport = app.TransportAMQP
	cfg.AMQPURL = amqpURL
	service := app.New(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.StartTimeout(startTimeout),
	)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	return app.Serve(ctx, service)
}

// TestServeBrokerRefusesCredentials shows that a broker's refusal of the
// credentials fails the start at once, naming the setting and not its
// password: it is not retried as an unreachable broker until the start
// times out (a minute here, longer than the test waits).
func TestServeBrokerRefusesCredentials(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.Require(t, testenv.AMQPURLVar))
	require.NoError(t, err)
	const password = "not-the-password-4711"
	u.User = url.UserPassword(u.User.Username(), password)
	err = serveAMQP(t, u.String(), time.Minute)
	require.ErrorContains(t, err, "amqp_url ("+app.EnvAMQPURL+"): amqp: the broker refused the credentials of amqp://")
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.NotContains(t, err.Error(), password)
}

// TestServeBrokerUnreachable shows that a broker still unreachable when
// the start times out fails it with the broker's error, naming the
// setting, rather than fx's bare "context deadline exceeded".
func TestServeBrokerUnreachable(t *testing.T) {
	t.Parallel()
	err := serveAMQP(t, closedAMQPURL(t, "s3cret"), 4*time.Second)
	require.ErrorContains(t, err, "amqp_url ("+app.EnvAMQPURL+"): amqp: broker unreachable at amqp://guest:xxxxx@127.0.0.1:")
	require.ErrorContains(t, err, "connection refused")
	require.NotContains(t, err.Error(), "s3cret")
}

// TestServeStopsWhileWaitingForTheDatabase: a stop asked for while the
// service still waits for its database, which took the connection and
// never answers, ends the wait, and serve returns nil at once, as for a
// stop during the start; SIGTERM killed the process there before. (The
// stop here is the command's context ending; SIGINT and SIGTERM end the
// same context.)
func TestServeStopsWhileWaitingForTheDatabase(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // taken, never answered
		}
	}()
	cfg := testConfig(t)
	cfg.Transport = app.TransportPostgres
	cfg.DatabaseURL = "postgres://nobody:wrong@" + l.Addr().String() + "/none?sslmode=disable"
	cfg.TransportURL = cfg.DatabaseURL
	cmd := app.Command("widgets", commandOptions(cfg))
	cmd.SetArgs([]string{"serve"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.NoError(t, cmd.ExecuteContext(ctx))
	require.Less(t, time.Since(start), 5*time.Second, "serve waited for the database after the stop (its connect timeout is 10 s)")
}
