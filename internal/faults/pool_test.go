package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// TestExhaustedPoolIsNoOutage: handlers too slow for their time, each
// holding a second connection of the service's pool besides its
// attempt's, exhaust the pool while PostgreSQL answers. That is the
// handlers' fault, not an outage: their attempts are charged, and each
// event is dead-lettered (timeout) after its attempts, as with a pool to
// spare. The outage check pings PostgreSQL through the same pool; a ping
// that waits for a connection behind the slow handlers must not read as
// a database that does not answer.
func TestExhaustedPoolIsNoOutage(t *testing.T) {
	t.Parallel()
	id := randomHex(5)
	slow := framework.Define[placedV1]("f"+id+".order.slow", 1)
	consumer := "faults.slow-" + id
	dbURL := testenv.PostgresURL(t)

	cfg, err := app.LoadConfig(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	cfg.Transport = app.TransportPostgres
	cfg.DatabaseURL, cfg.TransportURL = dbURL, dbURL
	cfg.AutoMigrate = true
	cfg.HTTPAddr = ""
	cfg.Consumers = map[string]middleware.Settings{consumer: {
		Attempts: 2, Timeout: 3 * time.Second, RetryDelay: 50 * time.Millisecond, BatchSize: 1, Concurrency: 8,
	}}
	newSlow := func(db *sqlx.DB) framework.HandlerFunc[placedV1] {
		return func(ctx context.Context, ev framework.Event[placedV1]) error {
			for range 2 { // more connections, outside the attempt's transaction
				conn, err := db.Conn(ctx)
				if err != nil {
					return err
				}
				defer conn.Close()
			}
			<-ctx.Done() // never in time
			return ctx.Err()
		}
	}
	var (
		transport driver.Transport
		db        *sqlx.DB
	)
	svc := app.New(
		handlers.Register(consumer, handlers.On(slow, newSlow)),
		fx.Supply(migrations),
		fx.Replace(cfg),
		fx.Populate(&transport, &db),
	)
	require.NoError(t, svc.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, svc.Stop(ctx))
	})

	const events = 24
	pool := db.Stats().MaxOpenConnections
	t.Logf("pool of %d connections, %d slow events", pool, events)
	start := time.Now()
	for n := 1; n <= events; n++ {
		env, err := slow.Envelope(placedV1{Order: n}, framework.Attributes{ID: fmt.Sprintf("s-%d", n), Source: "faults"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, transport.Publisher().Publish(slow.Type(), msg))
	}
	admin, err := postgres.Open(t.Context(), dbURL, postgres.OpenConfig{MaxOpenConns: 2})
	require.NoError(t, err)
	defer admin.Close()
	var dead int
	require.Eventually(t, func() bool {
		require.NoError(t, admin.Get(&dead, `SELECT count(*) FROM dead_letters WHERE consumer = $1 AND code = 'timeout'`, consumer))
		return dead == events
	}, waitLimit, 100*time.Millisecond, "every slow event dead-lettered as timeout after its attempts; %d were", dead)
	t.Logf("%d slow events dead-lettered (timeout) in %s", events, time.Since(start).Round(time.Millisecond))
}
