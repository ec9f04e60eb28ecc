package postgres_test

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestServerRestart restarts a private PostgreSQL cluster, which holds
// the transport's tables, while a subscriber drains a backlog: the
// subscriber and the publisher's pool reconnect by themselves and nothing
// is lost.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	c := testserver.StartPostgres(t)
	env := postgresEnv(t, c.URL)
	env.Timeout = 90 * time.Second
	transporttest.ExerciseServerRestart(t, env, func(t *testing.T) {
		c.Stop(t)
		time.Sleep(time.Second)
		c.Start(t)
	})
}
