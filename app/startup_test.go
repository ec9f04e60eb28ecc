package app_test

import (
	"context"
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
