package app_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/middleware"
)

// TestBreakerConfig: a consumer's breaker is read from YAML, takes the
// defaults: section's values, and a bad value names its key.
func TestBreakerConfig(t *testing.T) {
	t.Parallel()
	cfg, err := app.LoadConfig(env(t, `
defaults:
  breaker: {cool_down: 10s}
consumers:
  a.b:
    breaker: {failures: 5, max_hold: 2m, any_error: true}
`, nil))
	require.NoError(t, err)
	require.Equal(t, middleware.BreakerConfig{Failures: 5, AnyError: true, CoolDown: 10 * time.Second, MaxHold: 2 * time.Minute},
		cfg.Settings("a.b").Breaker)
	require.Equal(t, middleware.BreakerConfig{CoolDown: 10 * time.Second, MaxHold: middleware.DefaultBreakerMaxHold},
		cfg.Settings("c.d").Breaker, "off unless failures is set; max_hold takes middleware's default")

	for _, tc := range []struct{ yaml, key string }{
		{"consumers:\n  a.b:\n    breaker: {failures: -1}\n", "consumers.a.b.breaker.failures"},
		{"defaults:\n  breaker: {cool_down: -1s}\n", "defaults.breaker.cool_down"},
		{"consumers:\n  a.b:\n    breaker: {failures: 3, max_hold: 1h}\n", "consumers.a.b.breaker.max_hold"},
	} {
		_, err := app.LoadConfig(env(t, tc.yaml, nil))
		require.ErrorContains(t, err, tc.key)
	}
}

// TestBreakerReadyz: while a dependency fails, the consumer's breaker
// opens: /readyz stays 200 and shows it open, as does the gauge; a
// message published then waits at the breaker, and once the dependency is
// back it goes through as the probe, closing the breaker. Nothing is
// dead-lettered. (That a message waits uncounted, and is released at
// max_hold, the middleware's tests show on a clock of their own.)
func TestBreakerReadyz(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Consumers = map[string]middleware.Settings{consumerName: {
		Attempts: 50, RetryDelay: 100 * time.Millisecond,
		Breaker: middleware.BreakerConfig{Failures: 2, CoolDown: 200 * time.Millisecond},
	}}
	var outage atomic.Bool
	outage.Store(true)
	dependency := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if outage.Load() {
				return nil, framework.Dependency(errors.New("stock service down"))
			}
			return next(msg)
		}
	}
	b := setup(t, cfg, fx.Supply(app.Middleware{Inner: []message.HandlerMiddleware{dependency}}))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitLimit}
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := client.Get("http://" + b.http.Addr() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, body
	}
	// breaker reads the consumer's breaker from /readyz, which must
	// answer 200 whatever the breaker's state. A 503 may be a database
	// ping past /readyz's budget on a loaded machine (the breaker has no
	// part in it): it is read again, and one that lasts fails the test.
	breaker := func() string {
		t.Helper()
		var body []byte
		waitFor(t, "/readyz 200 (an open breaker leaves the service ready)", func() bool {
			var code int
			code, body = get("/readyz")
			return code == http.StatusOK
		})
		var got app.ReadyzBody
		require.NoError(t, json.Unmarshal(body, &got))
		require.Len(t, got.Consumers, 1)
		return got.Consumers[0].Breaker
	}
	gauge := func() string {
		t.Helper()
		_, body := get("/metrics")
		m := regexp.MustCompile(`(?m)^effectively_consumer_breaker_state\{consumer="` + regexp.QuoteMeta(consumerName) + `"\} (\S+)$`).FindSubmatch(body)
		require.NotNil(t, m, "the breaker's gauge in /metrics")
		return string(m[1])
	}

	require.Equal(t, "closed", breaker())
	require.Equal(t, "0", gauge())
	b.publish(t, "w-1", "sprocket")
	waitFor(t, "the breaker open", func() bool { return breaker() == "open" })
	require.Equal(t, "1", gauge())

	b.publish(t, "w-2", "gear")
	outage.Store(false)
	waitFor(t, "both widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 2 })
	waitFor(t, "the breaker closed", func() bool { return breaker() == "closed" })
	require.Equal(t, "0", gauge())
	require.Zero(t, b.count(t, `SELECT count(*) FROM dead_letters`))
}
