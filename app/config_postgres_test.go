package app_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// TestLoadConfigPostgresURLs: database_url and transport_url take a
// PostgreSQL URL as pgx (and libpq) read it, several hosts for a
// failover included; one pgx cannot read is refused at load, by its key,
// with why and without its password.
func TestLoadConfigPostgresURLs(t *testing.T) {
	t.Parallel()
	const (
		one      = "postgres://app:pw-4711@127.0.0.1:5432/app?sslmode=disable"
		failover = "postgres://app:pw-4711@127.0.0.1:5432,127.0.0.1:5433/app?target_session_attrs=read-write"
	)
	pgEnv := func(database, transport string) map[string]string {
		m := map[string]string{app.EnvTransport: app.TransportPostgres, app.EnvDatabaseURL: database}
		if transport != "" {
			m[app.EnvTransportURL] = transport
		}
		return m
	}
	for name, url := range map[string]string{
		"One":             one,
		"Failover":        failover,
		"PortsNotAll":     "postgres://app:pw-4711@db-1,db-2:5433,db-3/app?target_session_attrs=read-write", // net/url refuses it
		"PreferStandby":   "postgresql://app:pw-4711@db-1:5432,db-2:5432/app?target_session_attrs=prefer-standby",
		"IPv6":            "postgres://app:pw-4711@[::1]:5432,[::1]:5433/app?target_session_attrs=read-write",
		"ConnectTimeout":  failover + "&connect_timeout=2",
		"ApplicationName": failover + "&application_name=billing",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := app.LoadConfig(env(t, "", pgEnv(url, "")))
			require.NoError(t, err)
			require.Equal(t, url, cfg.DatabaseURL)
			require.Equal(t, url, cfg.TransportURL)
		})
	}
	for name, tc := range map[string]struct {
		env       map[string]string
		key, want string
	}{
		"Port":           {env: pgEnv("postgres://app:pw-4711@127.0.0.1:5432,127.0.0.1:x/app", ""), key: app.EnvDatabaseURL, want: "invalid port"},
		"SessionAttrs":   {env: pgEnv(failover+"x", ""), key: app.EnvDatabaseURL, want: "unknown target_session_attrs value: read-writex"},
		"Transport":      {env: pgEnv(one, "postgres://app:pw-4711@127.0.0.1:5432,[::1/app"), key: app.EnvTransportURL, want: "cannot parse it"},
		"TransportPorts": {env: pgEnv(one, "postgres://app:pw-4711@db-1:5432,db-2:5432,db-3:/app?target_session_attrs=any&sslmode=nope"), key: app.EnvTransportURL, want: "sslmode"},
	} {
		t.Run("Bad"+name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, "", tc.env))
			require.ErrorContains(t, err, tc.key)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "pw-")
			other := app.EnvTransportURL
			if tc.key == other {
				other = app.EnvDatabaseURL
			}
			require.False(t, strings.Contains(err.Error(), other), "only %s is named: %v", tc.key, err)
		})
	}
}
