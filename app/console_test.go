package app_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

const (
	consoleWriteSecret = "alice-0123456789abcdef"
	consoleReadSecret  = "bob-0123456789abcdef00"
)

// consoleConfig returns testConfig with the console on, with the tokens
// alice (write) and bob (read).
func consoleConfig(t *testing.T) app.Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.Console = app.ConsoleConfig{Enabled: true, Tokens: []string{"alice:" + consoleWriteSecret + ":write", "bob:" + consoleReadSecret + ":read"}}
	return cfg
}

func TestLoadConfigConsole(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}

	t.Run("OffByDefault", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(nil))
		require.NoError(t, err)
		require.Equal(t, app.ConsoleConfig{}, cfg.Console)
	})
	t.Run("FromEnv", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(map[string]string{
			app.EnvConsole:       "true",
			app.EnvConsoleTokens: "alice:" + consoleWriteSecret + ":write,bob:" + consoleReadSecret + ":read",
		}))
		require.NoError(t, err)
		require.True(t, cfg.Console.Enabled)
		require.Equal(t, []string{"alice:" + consoleWriteSecret + ":write", "bob:" + consoleReadSecret + ":read"}, cfg.Console.Tokens)
	})
	t.Run("FromFileEnvWins", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "effectively.yaml")
		require.NoError(t, os.WriteFile(path, []byte(`console:
  enabled: true
  tokens: ["carol:`+consoleWriteSecret+`:write"]
  trusted_origins: ["https://ops.example.com"]
`), 0o600))
		cfg, err := app.LoadConfig(env(map[string]string{app.EnvConfig: path}))
		require.NoError(t, err)
		want := app.ConsoleConfig{
			Enabled:        true,
			Tokens:         []string{"carol:" + consoleWriteSecret + ":write"},
			TrustedOrigins: []string{"https://ops.example.com"},
		}
		require.Equal(t, want, cfg.Console)
		cfg, err = app.LoadConfig(env(map[string]string{app.EnvConfig: path, app.EnvConsoleTokens: "bob:" + consoleReadSecret + ":read"}))
		require.NoError(t, err)
		require.Equal(t, []string{"bob:" + consoleReadSecret + ":read"}, cfg.Console.Tokens)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			env  map[string]string
			want []string
		}{
			{"NotABool", map[string]string{app.EnvConsole: "yes please"}, []string{`EFFECTIVELY_CONSOLE: want true or false, got "yes please"`}},
			{"NoToken", map[string]string{app.EnvConsole: "true"}, []string{"console.tokens (EFFECTIVELY_CONSOLE_TOKENS): the console is enabled without a token"}},
			{
				"NoHTTP",
				map[string]string{app.EnvConsole: "true", app.EnvHTTPAddr: "", app.EnvConsoleTokens: "alice:" + consoleWriteSecret + ":write"},
				[]string{"console.enabled (EFFECTIVELY_CONSOLE): the console is served on EFFECTIVELY_HTTP_ADDR, which is empty"},
			},
			{"BadTokens", map[string]string{app.EnvConsoleTokens: "alice:short-secret:write,bob:" + consoleReadSecret + ":admin"}, []string{
				"console.tokens (EFFECTIVELY_CONSOLE_TOKENS): token 1: secret of alice: want at least 16 characters",
				`token 2: permission: want read or write, got "admin"`,
			}},
		} {
			_, err := app.LoadConfig(env(tc.env))
			require.Error(t, err, tc.name)
			for _, want := range tc.want {
				require.ErrorContains(t, err, want, tc.name)
			}
			require.NotContains(t, err.Error(), "short-secret", "%s: an error never quotes a secret", tc.name)
		}
	})
}

// TestConsoleServed: the console is off by default; on, its pages need a
// token while /healthz, /readyz and /metrics stay open.
func TestConsoleServed(t *testing.T) {
	t.Parallel()
	client := &http.Client{Timeout: waitLimit, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(t *testing.T, url string, headers ...string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}

	t.Run("Off", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testConfig(t))
		require.Equal(t, http.StatusNotFound, get(t, "http://"+b.http.Addr()+"/console/dead-letters", "Authorization", "Bearer "+consoleWriteSecret))
	})
	t.Run("On", func(t *testing.T) {
		t.Parallel()
		b := setup(t, consoleConfig(t))
		base := "http://" + b.http.Addr()
		for _, path := range []string{"/healthz", "/metrics"} {
			require.Equal(t, http.StatusOK, get(t, base+path), "%s stays open", path)
		}
		// Ready once its database answers within /readyz's budget, which
		// a loaded machine can miss for a moment: unready is a 503, a
		// token asked for a 401.
		waitFor(t, "/readyz ready without a token", func() bool { return get(t, base+"/readyz") == http.StatusOK })
		for _, path := range []string{"/console/dead-letters", "/console/consumers", "/console/events?source=widgets&id=w-1"} {
			require.Equal(t, http.StatusUnauthorized, get(t, base+path), path)
			require.Equal(t, http.StatusOK, get(t, base+path, "Authorization", "Bearer "+consoleReadSecret), path)
		}
	})
}
