package middleware_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

// TestSettingsWithDefaults: the zero Settings take every default, and are
// valid; a field set stays as it is.
func TestSettingsWithDefaults(t *testing.T) {
	t.Parallel()
	s := middleware.Settings{}.WithDefaults()
	require.Equal(t, middleware.Settings{
		Attempts:      middleware.DefaultAttempts,
		RetryDelay:    middleware.DefaultRetryDelay,
		Timeout:       middleware.DefaultTimeout,
		Concurrency:   1,
		MaxDeliveries: middleware.DefaultMaxDeliveries,
		MaxBodyBytes:  framework.DefaultMaxBodyBytes,
		GapTimeout:    middleware.DefaultGapTimeout,
		BatchSize:     driver.DefaultBatchSize,
		Batches:       driver.DefaultBatches,
		Overlap:       driver.DefaultOverlap,
		Partitions:    1,
		Breaker:       middleware.BreakerConfig{CoolDown: middleware.DefaultBreakerCoolDown, MaxHold: middleware.DefaultBreakerMaxHold},
	}, s)
	require.NoError(t, s.Validate())
	require.Equal(t, 7, middleware.Settings{Attempts: 7}.WithDefaults().Attempts)
}

// TestSettingsMerge: a consumer's zero fields take the defaults' values,
// its own stay, and a switch is on when on in either.
func TestSettingsMerge(t *testing.T) {
	t.Parallel()
	own := middleware.Settings{Attempts: 5, SkipStale: true, Breaker: middleware.BreakerConfig{Failures: 3}}
	base := middleware.Settings{
		Attempts: 2, Timeout: time.Minute, RateLimit: 4, MaxBodyBytes: 100, BatchLinger: time.Millisecond, Overlap: 3,
		OrderFromFirstSeen: true, Breaker: middleware.BreakerConfig{Failures: 9, AnyError: true, MaxHold: time.Second},
	}
	require.Equal(t, middleware.Settings{
		Attempts: 5, Timeout: time.Minute, RateLimit: 4, MaxBodyBytes: 100, BatchLinger: time.Millisecond, Overlap: 3,
		SkipStale: true, OrderFromFirstSeen: true,
		Breaker: middleware.BreakerConfig{Failures: 3, AnyError: true, MaxHold: time.Second},
	}, own.Merge(base))
}

// TestSettingsValidate: every invalid setting is reported, each named by
// its YAML key, the handling time by the keys it adds up.
func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	bad := middleware.Settings{
		Attempts: -1, RetryDelay: -time.Second, Timeout: -time.Second, Concurrency: 2000, RateLimit: math.NaN(),
		MaxDeliveries: -1, MaxBodyBytes: -1, SkipStale: true, StrictOrder: true, GapTimeout: -1,
		BatchSize: 65, Batches: -1, BatchLinger: -time.Second, Overlap: 1025, Partitions: 65,
		Breaker: middleware.BreakerConfig{Failures: -1, CoolDown: -1, MaxHold: time.Hour},
	}.WithDefaults()
	err := bad.Validate()
	require.Error(t, err)
	for _, key := range []string{
		"attempts: want 1 or more, got -1", "retry_delay: ", "timeout: must be positive", "concurrency: want 1..1024, got 2000",
		"rate_limit: ", "max_deliveries: ", "max_body_bytes: ", "strict_order: not with skip_stale", "gap_timeout: ",
		"batch_size: want 1..64, got 65", "batches: want 1..64, got -1", "batch_linger: must not be negative",
		"overlap: want 1..1024, got 1025", "partitions: want 1..64, got 65",
		"breaker.failures: ", "breaker.cool_down: ", "breaker.max_hold: want more than 0 and at most 10m0s",
	} {
		require.Contains(t, err.Error(), key)
	}
	require.Len(t, strings.Split(err.Error(), "\n"), 17, "one line per setting: %v", err)

	err = middleware.Settings{Timeout: time.Second, BatchLinger: time.Second}.WithDefaults().Validate()
	require.EqualError(t, err, "batch_linger: want less than its timeout (1s): a batch waits within the time limit of its attempts, so a message that arrived alone would time out and be dead-lettered, got 1s")
	err = middleware.Settings{Attempts: 1 << 30, Timeout: time.Hour}.WithDefaults().Validate()
	require.ErrorContains(t, err, "attempts × (timeout + retry_delay) + breaker.max_hold: want at most 8760h0m0s")
}

// TestSettingsValidateBounds: a timeout, a gap timeout or a rate that
// no message can meet (1ns, 1e-300 messages a second) is refused, naming
// its key and its bound; the bound itself, and no rate limit, are valid.
func TestSettingsValidateBounds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		s    middleware.Settings
		want string // empty: valid
	}{
		{"Timeout", middleware.Settings{Timeout: time.Nanosecond}, "timeout: want at least 1ms (no attempt finishes sooner; it sizes the transports' leases), got 1ns"},
		{"TimeoutJustBelow", middleware.Settings{Timeout: time.Millisecond - 1}, "timeout: want at least 1ms"},
		{"TimeoutAtBound", middleware.Settings{Timeout: middleware.MinTimeout}, ""},
		{"GapTimeout", middleware.Settings{GapTimeout: time.Nanosecond}, "gap_timeout: want at least 1ms (an event ahead of its turn would be dead-lettered before the earlier one could run), got 1ns"},
		{"GapTimeoutAtBound", middleware.Settings{GapTimeout: middleware.MinGapTimeout}, ""},
		{"RateLimit", middleware.Settings{RateLimit: 1e-300}, "rate_limit: want 0 (no limit) or at least 0.000278 messages a second (one an hour; a message waiting longer for its turn is nacked), got 1e-300"},
		{"RateLimitJustBelow", middleware.Settings{RateLimit: 1.0 / 3601}, "rate_limit: want 0 (no limit) or at least 0.000278"},
		{"RateLimitAtBound", middleware.Settings{RateLimit: middleware.MinRateLimit}, ""},
		{"NoRateLimit", middleware.Settings{RateLimit: 0}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.s.WithDefaults().Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
			require.Len(t, strings.Split(err.Error(), "\n"), 1, "that setting alone")
		})
	}
}

// TestSettingsYAML: the YAML keys are the contract of the configuration
// file; durations are written as Go durations.
func TestSettingsYAML(t *testing.T) {
	t.Parallel()
	var s middleware.Settings
	require.NoError(t, yaml.Unmarshal([]byte(`
attempts: 4
retry_delay: 1.5s
timeout: 2m
concurrency: 8
rate_limit: 2.5
max_deliveries: 6
max_body_bytes: 2048
skip_stale: true
strict_order: false
gap_timeout: 1h
order_from_first_seen: true
batch_size: 16
batches: 3
batch_linger: 5ms
overlap: 12
partitions: 4
breaker: {failures: 5, any_error: true, cool_down: 30s, max_hold: 1m}
`), &s))
	require.Equal(t, middleware.Settings{
		Attempts: 4, RetryDelay: 1500 * time.Millisecond, Timeout: 2 * time.Minute, Concurrency: 8, RateLimit: 2.5,
		MaxDeliveries: 6, MaxBodyBytes: 2048, SkipStale: true, GapTimeout: time.Hour, OrderFromFirstSeen: true,
		BatchSize: 16, Batches: 3, BatchLinger: 5 * time.Millisecond, Overlap: 12, Partitions: 4,
		Breaker: middleware.BreakerConfig{Failures: 5, AnyError: true, CoolDown: 30 * time.Second, MaxHold: time.Minute},
	}, s)
}
