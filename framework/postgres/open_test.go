package postgres_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BoundsThePool", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, testenv.PostgresURL(t), postgres.OpenConfig{MaxOpenConns: 3})
		require.NoError(t, err)
		defer db.Close()
		require.Equal(t, 3, db.Stats().MaxOpenConnections)
		require.Equal(t, postgres.DriverName, db.DriverName())
	})

	t.Run("DefaultsThePool", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, testenv.PostgresURL(t), postgres.OpenConfig{})
		require.NoError(t, err)
		defer db.Close()
		require.Equal(t, postgres.DefaultMaxOpenConns, db.Stats().MaxOpenConnections)
		require.Equal(t, postgres.DefaultConnectTimeout, postgres.OpenConfig{}.WithDefaults().ConnectTimeout, "no connection waits for ever")
	})

	t.Run("PingsTheServer", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := postgres.Open(ctx, "postgres://nobody:wrong@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", postgres.OpenConfig{})
		require.ErrorContains(t, err, "ping")
		require.NotContains(t, err.Error(), "wrong", "the password stays out of the error")
	})

	// A server that takes the connection and never answers (hung, or a
	// proxy in front of one that is down): Open, whose context has no
	// deadline (the commands' and the service's start), gave up never.
	t.Run("GivesUpOnASilentServer", func(t *testing.T) {
		t.Parallel()
		addr := silentServer(t)
		for _, c := range []struct {
			name string
			url  string
			cfg  postgres.OpenConfig
		}{
			{"ConnectTimeout", "postgres://nobody:wrong@" + addr + "/none?sslmode=disable", postgres.OpenConfig{ConnectTimeout: 300 * time.Millisecond}},
			{"TheURLsConnectTimeout", "postgres://nobody:wrong@" + addr + "/none?sslmode=disable&connect_timeout=1", postgres.OpenConfig{ConnectTimeout: time.Hour}},
		} {
			done := make(chan error, 1)
			go func() {
				_, err := postgres.Open(context.Background(), c.url, c.cfg)
				done <- err
			}()
			select {
			case err := <-done:
				require.ErrorContains(t, err, "ping", c.name)
				require.ErrorContains(t, err, "database=none", "%s: the error names the database", c.name)
				require.NotContains(t, err.Error(), "wrong", "the password stays out of the error")
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: Open still waits for a server that never answers", c.name)
			}
		}
	})

	t.Run("Validates", func(t *testing.T) {
		t.Parallel()
		_, err := postgres.Open(ctx, "", postgres.OpenConfig{})
		require.ErrorIs(t, err, postgres.ErrEmptyURL)
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{MaxOpenConns: -1})
		require.ErrorContains(t, err, "MaxOpenConns")
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{MaxOpenConns: 2, MaxIdleConns: 3})
		require.ErrorContains(t, err, "MaxIdleConns")
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{ConnectTimeout: -time.Second})
		require.ErrorContains(t, err, "ConnectTimeout")
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{ApplicationName: strings.Repeat("a", postgres.MaxApplicationName+1)})
		require.ErrorContains(t, err, "ApplicationName must be at most")
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{ApplicationName: "caf\u00e9"})
		require.ErrorContains(t, err, "ApplicationName must be printable ASCII")
	})

	t.Run("ApplicationName", func(t *testing.T) {
		t.Parallel()
		url := testenv.Require(t, testenv.PostgresURLVar)
		if strings.Contains(url, "?") {
			url += "&application_name=from-the-url"
		} else {
			url += "?application_name=from-the-url"
		}
		for _, c := range []struct{ name, want string }{{"", "from-the-url"}, {"host-42-0a1b2c3d", "host-42-0a1b2c3d"}} {
			db, err := postgres.Open(ctx, url, postgres.OpenConfig{ApplicationName: c.name})
			require.NoError(t, err)
			var got string
			err = db.GetContext(ctx, &got, `SELECT current_setting('application_name')`)
			require.NoError(t, db.Close())
			require.NoError(t, err)
			require.Equal(t, c.want, got, "OpenConfig.ApplicationName %q over the URL's", c.name)
		}
	})
}

// silentServer returns the address of a server that accepts connections
// and never writes a byte.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return l.Addr().String()
}
