package middleware_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/middleware"
)

// TestConfigValidate: Handler refuses an invalid Config with an error that
// names the field.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	db, store := backends[0].open(t, nil) // SQLite
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error { return nil }))
	require.NoError(t, err)
	valid := middleware.Config{Consumer: c, UnitOfWork: uow, Store: store}
	_, _, err = middleware.Handler(valid)
	require.NoError(t, err, "the zero fields take their defaults")

	for want, edit := range map[string]func(*middleware.Config){
		"Config.Consumer: required":                                                        func(c *middleware.Config) { c.Consumer = nil },
		"Config.UnitOfWork: required":                                                      func(c *middleware.Config) { c.UnitOfWork = nil },
		"Config.Store: required":                                                           func(c *middleware.Config) { c.Store = nil },
		"Config.Settings.attempts: want 1 or more, got -1":                                 func(c *middleware.Config) { c.Attempts = -1 },
		"Config.Settings.retry_delay: must not be negative":                                func(c *middleware.Config) { c.RetryDelay = -1 },
		"Config.Settings.max_deliveries: want 1 or more":                                   func(c *middleware.Config) { c.MaxDeliveries = -1 },
		"Config.Settings.rate_limit: want 0 (no limit) or more messages a second, got -2":  func(c *middleware.Config) { c.RateLimit = -2 },
		"Config.Settings.rate_limit: want 0 (no limit) or more messages a second, got NaN": func(c *middleware.Config) { c.RateLimit = math.NaN() },
		"Config.Settings.strict_order: not with skip_stale":                                func(c *middleware.Config) { c.SkipStale, c.StrictOrder = true, true },
		"Config.Settings.gap_timeout: must be positive":                                    func(c *middleware.Config) { c.GapTimeout = -1 },
		"Config.Settings.max_body_bytes: want 1 or more":                                   func(c *middleware.Config) { c.MaxBodyBytes = -1 },
	} {
		cfg := valid
		edit(&cfg)
		_, _, err := middleware.Handler(cfg)
		require.ErrorContains(t, err, want)
	}
}
