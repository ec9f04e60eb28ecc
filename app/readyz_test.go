package app_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// TestReadyzDatabaseBlackHole: while the database's connections forward
// nothing (a black hole, not a refused connection), /readyz answers
// within a second and says the service is unavailable within 5 s, then
// ready again once the database answers. It took more than 2 s to answer.
func TestReadyzDatabaseBlackHole(t *testing.T) {
	t.Parallel()
	cfg := postgresConfig(t)
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	cfg.DatabaseURL, cfg.TransportURL = u.String(), u.String()
	testReadyzBlackHole(t, setup(t, cfg), proxy, "database unavailable")
}

// TestReadyzBrokerBlackHole is TestReadyzDatabaseBlackHole for RabbitMQ:
// /readyz kept answering 200 while the broker's connection forwarded
// nothing, until the heartbeat closed it three heartbeats later.
func TestReadyzBrokerBlackHole(t *testing.T) {
	t.Parallel()
	cfg := amqpConfig(t)
	u, err := url.Parse(cfg.AMQPURL)
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	cfg.AMQPURL = u.String()
	b, _ := setupIsolated(t, cfg)
	testReadyzBlackHole(t, b, proxy, "transport not connected")
}

// testReadyzBlackHole makes proxy, on the path to a server of b, a black
// hole: /readyz must answer within about a second all along, say reason
// within 5 s, and ready again once the hole is mended.
func testReadyzBlackHole(t *testing.T, b *bundle, proxy *testenv.Proxy, reason string) {
	t.Helper()
	t.Cleanup(func() { proxy.Hole(false) }) // before the service stops
	ready := readyzOf(t, b)
	readyz := func() (int, string, time.Duration) {
		t.Helper()
		start := time.Now()
		code, reason := ready()
		return code, reason, time.Since(start)
	}
	code, _, _ := readyz()
	require.Equal(t, http.StatusOK, code)

	proxy.Hole(true)
	holed := time.Now()
	for {
		code, got, took := readyz()
		require.Less(t, took, time.Second+time.Second/2, "/readyz answers within about a second (under -race on 2 cores)")
		if code == http.StatusServiceUnavailable {
			require.Equal(t, reason, got)
			break
		}
		require.Less(t, time.Since(holed), 5*time.Second, "unready within 5 s of the black hole")
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("unready %v after the black hole began", time.Since(holed).Round(10*time.Millisecond))

	proxy.Hole(false)
	mended := time.Now()
	require.Eventually(t, func() bool {
		code, _, _ := readyz()
		return code == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "ready again once the server answers")
	t.Logf("ready %v after the hole was mended", time.Since(mended).Round(10*time.Millisecond))
}

// TestDatabaseBlackHoleSpendsNoAttempt: a database that answers nothing
// for seconds (a black hole) while events arrive costs them no attempt:
// an attempt that runs out of time while the database does not answer a
// ping is the database's outage, not the event's failure; the consumer
// waits for the database and goes on. Every event takes effect once,
// none is dead-lettered. Two attempts of a second each ran out and
// dead-lettered valid events as retries_exhausted.
func TestDatabaseBlackHoleSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	cfg := amqpConfig(t)
	u, err := url.Parse(testenv.PostgresURL(t))
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	cfg.DatabaseURL = u.String()
	cfg.Defaults = middleware.Settings{Attempts: 2, Timeout: time.Second, RetryDelay: 50 * time.Millisecond}
	b, _ := setupIsolated(t, cfg)
	t.Cleanup(func() { proxy.Hole(false) }) // before the service stops

	for i := range 5 {
		b.publish(t, fmt.Sprintf("w-%d", i), "sprocket")
	}
	waitFor(t, "the first five", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 5 })

	proxy.Hole(true)
	for i := 5; i < 10; i++ {
		b.publish(t, fmt.Sprintf("w-%d", i), "sprocket")
	}
	time.Sleep(4 * time.Second) // four times an attempt's time
	proxy.Hole(false)

	waitFor(t, "all ten, once each", func() bool {
		return b.count(t, `SELECT count(DISTINCT event_id) FROM widgets`) == 10
	})
	require.Equal(t, 10, b.count(t, `SELECT count(*) FROM widgets`), "once each")
	require.Zero(t, b.count(t, `SELECT count(*) FROM dead_letters`), "no valid event dead-lettered for the outage")
}

// readyzOf returns a function that reads b's /readyz: its status code
// and reason.
func readyzOf(t *testing.T, b *bundle) func() (int, string) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	return func() (int, string) {
		t.Helper()
		resp, err := client.Get("http://" + b.http.Addr() + "/readyz")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var v struct {
			Reason string `json:"reason"`
		}
		require.NoError(t, json.Unmarshal(body, &v), "%s", body)
		return resp.StatusCode, v.Reason
	}
}
