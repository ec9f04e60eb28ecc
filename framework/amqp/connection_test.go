package amqp

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestConnectAccessRefused shows that Connect does not retry a broker's
// refusal of the URL's credentials or virtual host: it fails at once with
// ErrAccessRefused, which never shows the password. A retry would run
// until the context's deadline and end with context.DeadlineExceeded.
func TestConnectAccessRefused(t *testing.T) {
	t.Parallel()
	base, err := url.Parse(testenv.Require(t, testenv.AMQPURLVar))
	require.NoError(t, err)
	const password = "not-the-password-4711"
	wrongPassword := *base
	wrongPassword.User = url.UserPassword(base.User.Username(), password)
	noSuchVhost := *base
	noSuchVhost.Path = "/no-such-vhost"

	for name, u := range map[string]*url.URL{"WrongPassword": &wrongPassword, "NoSuchVirtualHost": &noSuchVhost} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conn, err := newConnection(TransportConfig{URL: u.String(), ConnectInterval: 10 * time.Millisecond, MaxConnectInterval: 10 * time.Millisecond})
			require.NoError(t, err)
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = conn.Connect(ctx)
			require.ErrorIs(t, err, ErrAccessRefused)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "not retried")
			require.ErrorContains(t, err, "xxxxx@"+u.Host)
			require.NotContains(t, err.Error(), password)
			require.False(t, conn.Connected())
		})
	}
}

// TestHeartbeat: the connection proposes TransportConfig.Heartbeat, and
// the broker (whose own is longer) takes it; a heartbeat in the URL wins.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	base := testenv.Require(t, testenv.AMQPURLVar)
	for name, tc := range map[string]struct {
		url       string
		heartbeat time.Duration
		want      time.Duration
	}{
		"Default":  {base, 0, DefaultHeartbeat},
		"Set":      {base, 2 * time.Second, 2 * time.Second},
		"InTheURL": {base + "?heartbeat=3", 2 * time.Second, 3 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := newConnection(TransportConfig{URL: tc.url, Heartbeat: tc.heartbeat})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, c.Connect(ctx))
			defer func() { require.NoError(t, c.Close()) }()
			w, err := c.wrapper()
			require.NoError(t, err)
			require.Equal(t, tc.want, w.Connection().Config.Heartbeat)
		})
	}
}
