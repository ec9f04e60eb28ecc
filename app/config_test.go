package app_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// env returns a lookupEnv over vars, and, when yaml is not empty, writes it
// to a file that EFFECTIVELY_CONFIG names.
func env(t *testing.T, yaml string, vars map[string]string) func(string) (string, bool) {
	t.Helper()
	all := make(map[string]string, len(vars)+1)
	for k, v := range vars {
		all[k] = v
	}
	if yaml != "" {
		path := filepath.Join(t.TempDir(), "effectively.yaml")
		require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
		all[app.EnvConfig] = path
	}
	return func(key string) (string, bool) {
		v, ok := all[key]
		return v, ok
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, "", nil))
		require.NoError(t, err)
		require.Equal(t, app.DefaultTransport, cfg.Transport)
		require.Equal(t, app.DefaultDatabaseURL, cfg.DatabaseURL)
		require.Equal(t, app.DefaultDatabaseURL, cfg.TransportURL, "the transport shares the stores' database")
		require.Equal(t, app.DefaultAMQPURL, cfg.AMQPURL)
		require.Equal(t, app.DefaultHTTPAddr, cfg.HTTPAddr)
		require.False(t, cfg.AutoMigrate)
		require.Empty(t, cfg.TablePrefix)

		cc := cfg.Settings("any.consumer")
		require.Equal(t, middleware.DefaultAttempts, cc.Attempts)
		require.Equal(t, middleware.DefaultRetryDelay, cc.RetryDelay)
		require.Equal(t, middleware.DefaultTimeout, cc.Timeout)
		require.Equal(t, app.DefaultSQLiteConcurrency, cc.Concurrency, "sqlite, the default transport")
		require.Equal(t, middleware.DefaultMaxDeliveries, cc.MaxDeliveries)
		require.Zero(t, cc.RateLimit)
	})

	t.Run("Env", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, "", map[string]string{
			app.EnvTransport:    "memory",
			app.EnvDatabaseURL:  "file:/tmp/x/stores.db",
			app.EnvTransportURL: "/tmp/x/transport.db",
			app.EnvAMQPURL:      "amqp://u:p@rabbit:5672/",
			app.EnvAutoMigrate:  "true",
			app.EnvTablePrefix:  "fx_",
			app.EnvHTTPAddr:     ":0",
		}))
		require.NoError(t, err)
		require.Equal(t, app.Config{
			Transport:     "memory",
			DatabaseURL:   "file:/tmp/x/stores.db",
			TransportURL:  "/tmp/x/transport.db",
			AMQPURL:       "amqp://u:p@rabbit:5672/",
			AutoMigrate:   true,
			TablePrefix:   "fx_",
			HTTPAddr:      ":0",
			PurgeInterval: app.Duration(app.DefaultPurgeInterval),
			// The purge's retentions.
			OutboxRetention:     app.Duration(app.DefaultOutboxRetention),
			OutboxBatchTimeout:  app.Duration(outbox.DefaultBatchTimeout),
			ReplayRetention:     app.Duration(app.DefaultReplayRetention),
			DeadLetterRetention: app.Duration(app.DefaultDeadLetterRetention),
			TransportRetention:  app.Duration(app.DefaultTransportRetention),
			PartitionLease:      app.Duration(driver.DefaultLease),
		}, cfg)
	})

	t.Run("EmptyHTTPAddrTurnsHTTPOff", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, "http_addr: 127.0.0.1:1234\n", map[string]string{app.EnvHTTPAddr: ""}))
		require.NoError(t, err)
		require.Empty(t, cfg.HTTPAddr)
	})

	t.Run("YAML", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, `
transport: memory
database_url: /tmp/y/stores.db
auto_migrate: true
table_prefix: y_
http_addr: 127.0.0.1:0
outbox_batch_size: 200
outbox_batch_bytes: 4194304
outbox_drop_unroutable: [audit.page-viewed]
partition_lease: 4s
defaults:
  attempts: 5
  timeout: 2s
consumers:
  billing.charge-on-order-placed:
    attempts: 2
    retry_delay: 250ms
    concurrency: 4
    rate_limit: 7.5
    max_deliveries: 6
    skip_stale: true
    batch_size: 8
    batch_linger: 5ms
  shipping.track-on-parcel-moved:
    strict_order: true
    order_from_first_seen: true
`, nil))
		require.NoError(t, err)
		require.Equal(t, "memory", cfg.Transport)
		require.Equal(t, "/tmp/y/stores.db", cfg.DatabaseURL)
		require.Equal(t, "/tmp/y/stores.db", cfg.TransportURL)
		require.True(t, cfg.AutoMigrate)
		require.Equal(t, "y_", cfg.TablePrefix)
		require.Equal(t, "127.0.0.1:0", cfg.HTTPAddr)
		require.Equal(t, 200, cfg.OutboxBatchSize)
		require.Equal(t, 4<<20, cfg.OutboxBatchBytes)
		require.Equal(t, []string{"audit.page-viewed"}, cfg.OutboxDropUnroutable)
		require.Equal(t, app.Duration(4*time.Second), cfg.PartitionLease)

		require.Equal(t, middleware.Settings{
			Attempts:      2,
			RetryDelay:    250 * time.Millisecond,
			Timeout:       2 * time.Second, // from defaults
			Concurrency:   4,
			RateLimit:     7.5,
			MaxDeliveries: 6,
			SkipStale:     true,
			GapTimeout:    middleware.DefaultGapTimeout,
			BatchSize:     8,
			Batches:       driver.DefaultBatches,
			Overlap:       driver.DefaultOverlap,
			Partitions:    1,
			BatchLinger:   5 * time.Millisecond,
			MaxBodyBytes:  framework.DefaultMaxBodyBytes,
			Breaker:       middleware.BreakerConfig{CoolDown: middleware.DefaultBreakerCoolDown, MaxHold: middleware.DefaultBreakerMaxHold},
		}, cfg.Settings("billing.charge-on-order-placed"))
		require.Equal(t, middleware.Settings{
			Attempts:      5,
			RetryDelay:    middleware.DefaultRetryDelay,
			Timeout:       2 * time.Second,
			Concurrency:   app.DefaultConcurrency,
			MaxDeliveries: middleware.DefaultMaxDeliveries,
			GapTimeout:    middleware.DefaultGapTimeout,
			BatchSize:     driver.DefaultBatchSize,
			Batches:       driver.DefaultBatches,
			Overlap:       driver.DefaultOverlap,
			Partitions:    1,
			MaxBodyBytes:  framework.DefaultMaxBodyBytes,
			Breaker:       middleware.BreakerConfig{CoolDown: middleware.DefaultBreakerCoolDown, MaxHold: middleware.DefaultBreakerMaxHold},
		}, cfg.Settings("other.consumer"))
		track := cfg.Settings("shipping.track-on-parcel-moved")
		require.True(t, track.StrictOrder)
		require.True(t, track.OrderFromFirstSeen)
		require.False(t, cfg.Settings("other.consumer").OrderFromFirstSeen, "subjects start at #1 by default")
	})

	t.Run("EnvWinsOverYAML", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, `
transport: sqlite
database_url: /tmp/yaml.db
auto_migrate: true
table_prefix: yaml_
http_addr: 127.0.0.1:1
`, map[string]string{
			app.EnvTransport:   "memory",
			app.EnvDatabaseURL: "/tmp/env.db",
			app.EnvAutoMigrate: "false",
			app.EnvTablePrefix: "env_",
			app.EnvHTTPAddr:    "127.0.0.1:2",
		}))
		require.NoError(t, err)
		require.Equal(t, "memory", cfg.Transport)
		require.Equal(t, "/tmp/env.db", cfg.DatabaseURL)
		require.Equal(t, "/tmp/env.db", cfg.TransportURL)
		require.False(t, cfg.AutoMigrate)
		require.Equal(t, "env_", cfg.TablePrefix)
		require.Equal(t, "127.0.0.1:2", cfg.HTTPAddr)
	})

	// A boolean reads the same in the environment as in the file: the
	// words YAML takes for its key (yes, on, y), and strconv.ParseBool's
	// (1, t), in any case.
	t.Run("BooleanWords", func(t *testing.T) {
		t.Parallel()
		for v, want := range map[string]bool{
			"true": true, "TRUE": true, "yes": true, "Yes": true, "on": true, "ON": true, "y": true, "1": true, "t": true,
			"false": false, "False": false, "no": false, "NO": false, "off": false, "Off": false, "n": false, "0": false, "f": false,
		} {
			cfg, err := app.LoadConfig(env(t, "", map[string]string{app.EnvAutoMigrate: v, app.EnvConsole: v, app.EnvConsoleTokens: "ops:0123456789abcdef:read"}))
			require.NoError(t, err, v)
			require.Equal(t, want, cfg.AutoMigrate, v)
			require.Equal(t, want, cfg.Console.Enabled, v)
			if v != "1" && v != "0" && v != "t" && v != "f" { // the file refuses these
				cfg, err = app.LoadConfig(env(t, "auto_migrate: "+v+"\nconsole:\n  enabled: "+v+"\n  tokens: [\"ops:0123456789abcdef:read\"]\n", nil))
				require.NoError(t, err, v)
				require.Equal(t, want, cfg.AutoMigrate, "YAML %s", v)
				require.Equal(t, want, cfg.Console.Enabled, "YAML %s", v)
			}
		}
	})

	t.Run("DefaultConcurrencyByTransport", func(t *testing.T) {
		t.Parallel()
		yaml := "consumers:\n  a.alone:\n    batch_size: 1\n  a.set:\n    concurrency: 7\n"
		for transport, want := range map[string]int{
			app.TransportSQLite:   app.DefaultSQLiteConcurrency,
			app.TransportPostgres: app.DefaultConcurrency,
			app.TransportAMQP:     app.DefaultConcurrency,
			app.TransportMemory:   app.DefaultConcurrency,
		} {
			vars := map[string]string{app.EnvTransport: transport}
			if transport == app.TransportPostgres {
				vars[app.EnvDatabaseURL] = "postgres://u:p@127.0.0.1:1/db"
			}
			cfg, err := app.LoadConfig(env(t, yaml, vars))
			require.NoError(t, err, transport)
			require.Equal(t, want, cfg.Settings("a.any").Concurrency, transport)
			require.Equal(t, 7, cfg.Settings("a.set").Concurrency, transport)
			// A transaction per message holds a connection per message
			// in flight: fewer.
			require.Equal(t, app.DefaultUngroupedConcurrency, cfg.Settings("a.alone").Concurrency, transport)
		}
	})

	t.Run("StoresOnPostgresMessagesOnSQLite", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, "", map[string]string{
			app.EnvDatabaseURL:  "postgres://u:p@127.0.0.1:1/db",
			app.EnvTransportURL: "/tmp/x/messages.db",
		}))
		require.NoError(t, err)
		require.Equal(t, app.TransportSQLite, cfg.Transport)
	})

	t.Run("EmptyYAML", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "empty.yaml")
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		cfg, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: path}))
		require.NoError(t, err)
		require.Equal(t, app.DefaultDatabaseURL, cfg.DatabaseURL)
	})

	t.Run("MissingYAML", func(t *testing.T) {
		t.Parallel()
		_, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: filepath.Join(t.TempDir(), "missing.yaml")}))
		require.ErrorContains(t, err, app.EnvConfig)
		require.ErrorIs(t, err, os.ErrNotExist)
	})
}

// TestLoadConfigBadValue checks that each bad value stops loading with an
// error that names its key.
func TestLoadConfigBadValue(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		yaml string
		env  map[string]string
		key  string
	}{
		{name: "Transport", env: map[string]string{app.EnvTransport: "kafka"}, key: app.EnvTransport},
		{name: "TransportYAML", yaml: "transport: kafka\n", key: app.EnvTransport},
		{name: "SQLiteOnPostgres", env: map[string]string{app.EnvDatabaseURL: "postgres://localhost/db"}, key: app.EnvTransport},
		{name: "PostgresOnSQLite", env: map[string]string{app.EnvTransport: "postgres"}, key: app.EnvTransport},
		{name: "AMQPURL", env: map[string]string{app.EnvTransport: "amqp", app.EnvAMQPURL: "http://127.0.0.1:5672/"}, key: app.EnvAMQPURL},
		{name: "AMQPPrefetch", yaml: "amqp_prefetch: -1\n", key: "amqp_prefetch"},
		{name: "StrictOrderAndSkipStale", yaml: "consumers:\n  a.b:\n    skip_stale: true\n    strict_order: true\n", key: "consumers.a.b.strict_order"},
		{name: "GapTimeout", yaml: "defaults:\n  gap_timeout: -1s\n", key: "defaults.gap_timeout"},
		{name: "ProcessedRetention", yaml: "processed_retention: -1h\n", key: "processed_retention"},
		{name: "ProcessedRetentionNotADuration", yaml: "processed_retention: a month\n", key: "processed_retention"},
		{name: "ProcessedRetentionTooShort", yaml: "processed_retention: 1ns\n", key: "processed_retention: want at least 1h0m0s"},
		{name: "ProcessedRetentionMinutes", yaml: "processed_retention: 59m\n", key: "processed_retention: want at least 1h0m0s"},
		{name: "OutboxRetention", yaml: "outbox_retention: -1h\n", key: "outbox_retention"},
		{name: "OutboxBatchTimeout", yaml: "outbox_batch_timeout: -1s\n", key: "outbox_batch_timeout"},
		{name: "OutboxBatchSize", yaml: "outbox_batch_size: -1\n", key: "outbox_batch_size: want 1 or more"},
		{name: "OutboxBatchBytes", yaml: "outbox_batch_bytes: -5\n", key: "outbox_batch_bytes: want 1 or more"},
		{name: "OutboxBatchBytesFraction", yaml: "outbox_batch_bytes: 1.5\n", key: "outbox_batch_bytes (line 1): want a whole number"},
		{name: "OutboxDropUnroutableEmpty", yaml: "outbox_drop_unroutable: [\"\"]\n", key: "outbox_drop_unroutable[0]: want an event type"},
		{name: "ReplayRetention", yaml: "replay_retention: -1h\n", key: "replay_retention"},
		{name: "DeadLetterRetention", yaml: "dead_letter_retention: -1h\n", key: "dead_letter_retention"},
		{name: "TransportRetention", yaml: "transport_retention: -1h\n", key: "transport_retention"},
		{name: "PartitionLeaseNegative", yaml: "partition_lease: -3s\n", key: "partition_lease: want 1s to 10m0s"},
		{name: "PartitionLeaseTooShort", yaml: "partition_lease: 500ms\n", key: "partition_lease: want 1s to 10m0s"},
		{name: "PartitionLeaseTooLong", yaml: "partition_lease: 11m\n", key: "partition_lease: want 1s to 10m0s"},
		{name: "PartitionLeaseNotADuration", yaml: "partition_lease: 3\n", key: "partition_lease (line 1): want a duration"},
		{name: "AutoMigrate", env: map[string]string{app.EnvAutoMigrate: "maybe"}, key: app.EnvAutoMigrate},
		{name: "AutoMigrateYAML", yaml: "auto_migrate: maybe\n", key: "auto_migrate"},
		{name: "TablePrefix", env: map[string]string{app.EnvTablePrefix: "bad-prefix"}, key: app.EnvTablePrefix},
		{name: "TablePrefixYAML", yaml: "table_prefix: 1abc\n", key: app.EnvTablePrefix},
		{name: "HTTPAddr", env: map[string]string{app.EnvHTTPAddr: "localhost"}, key: app.EnvHTTPAddr},
		{name: "ConsumerAttemptsNegative", yaml: "consumers:\n  a.b:\n    attempts: -1\n", key: "consumers.a.b.attempts"},
		{name: "ConsumerAttemptsNotANumber", yaml: "consumers:\n  a.b:\n    attempts: three\n", key: "consumers.a.b.attempts"},
		// yaml.v3 truncates a fraction into an integer: 1.5 was 1.
		{name: "ConsumerAttemptsFraction", yaml: "consumers:\n  a.b:\n    attempts: 1.5\n", key: "consumers.a.b.attempts (line 3): want a whole number, got \"1.5\""},
		{name: "AMQPPrefetchFraction", yaml: "amqp_prefetch: 2.9\n", key: "amqp_prefetch (line 1): want a whole number"},
		{name: "BatchLingerOverTimeout", yaml: "defaults:\n  timeout: 2s\nconsumers:\n  a.b:\n    batch_linger: 2s\n", key: "consumers.a.b.batch_linger: want less than its timeout (2s)"},
		{name: "BatchLingerOverDefaultTimeout", yaml: "defaults:\n  batch_linger: 1h\n", key: "defaults.batch_linger"},
		{name: "AttemptsOverflow", yaml: "consumers:\n  a.b:\n    attempts: 1000000000\n", key: "consumers.a.b: attempts × (timeout + retry_delay) + breaker.max_hold: want at most 8760h0m0s"},
		{name: "TimeoutOverflow", yaml: "defaults:\n  timeout: 2000000h\n", key: "defaults: attempts × (timeout + retry_delay)"},
		{name: "BreakerFailuresFraction", yaml: "defaults:\n  breaker:\n    failures: 0.5\n", key: "defaults.breaker.failures (line 3)"},
		{name: "ConsumerConcurrency", yaml: "consumers:\n  a.b:\n    concurrency: 5000\n", key: "consumers.a.b.concurrency"},
		{name: "ConsumerRetryDelay", yaml: "consumers:\n  a.b:\n    retry_delay: -1s\n", key: "consumers.a.b.retry_delay"},
		{name: "DefaultsMaxDeliveries", yaml: "defaults:\n  max_deliveries: -2\n", key: "defaults.max_deliveries"},
		{name: "DefaultsRateLimit", yaml: "defaults:\n  rate_limit: -1\n", key: "defaults.rate_limit"},
		{name: "DefaultsRateLimitNaN", yaml: "defaults:\n  rate_limit: .nan\n", key: "defaults.rate_limit"},
		{name: "UnknownKey", yaml: "transprot: sqlite\n", key: "transprot"},
		{name: "UnknownConsumerKey", yaml: "consumers:\n  a.b:\n    attemps: 2\n", key: "attemps"}, //nolint:misspell // the typo is the point
		{name: "BadDuration", yaml: "defaults:\n  timeout: 5 minutes\n", key: "defaults.timeout"},
		{name: "BadConsumerDuration", yaml: "consumers:\n  a.b:\n    retry_delay: soon\n", key: "consumers.a.b.retry_delay"},
		// The consumers' durations are time.Duration: yaml.v3's own error,
		// for a number as for a word, names the key and asks for a
		// duration (not a whole number).
		{name: "BadDurationText", yaml: "defaults:\n  timeout: 5 minutes\n", key: `defaults.timeout (line 2): want a duration such as 500ms or 2s, got "5 minutes"`},
		{name: "DurationNumber", yaml: "consumers:\n  a.b:\n    gap_timeout: 5\n", key: `consumers.a.b.gap_timeout (line 3): want a duration such as 500ms or 2s, got "5"`},
		{name: "DurationFraction", yaml: "defaults:\n  breaker:\n    max_hold: 1.5\n", key: `defaults.breaker.max_hold (line 3): want a duration such as 500ms or 2s, got "1.5"`},
		{name: "MaxBodyBytes", yaml: "consumers:\n  a.b:\n    max_body_bytes: -1\n", key: "consumers.a.b.max_body_bytes: want 1 or more, got -1"},
		{name: "MalformedConsumerName", yaml: "consumers:\n  Bad_Name:\n    attempts: 2\n", key: "consumers.Bad_Name"},
		{name: "NotAMapping", yaml: "- a\n- b\n", key: app.EnvConfig},
		{name: "PostgresURLWithoutColon", yaml: "database_url: postgres//app:secret@db/app\n", key: "database_url (EFFECTIVELY_DATABASE_URL): begins as a PostgreSQL URL but is not one"},
		{name: "PostgresURLOneSlash", env: map[string]string{app.EnvDatabaseURL: "postgresql:/db/app"}, key: "database_url (EFFECTIVELY_DATABASE_URL): begins as a PostgreSQL URL"},
		{name: "PostgresURLUpperCase", env: map[string]string{app.EnvTransport: "postgres", app.EnvDatabaseURL: "postgres://db/app", app.EnvTransportURL: "POSTGRES://db/app"}, key: "transport_url (EFFECTIVELY_TRANSPORT_URL): begins as a PostgreSQL URL"},
		// Another database's URL, or SQLite's written as a URL: SQLite
		// took it for a path and created its folders ("mysql:/app:...").
		{name: "MySQLURL", env: map[string]string{app.EnvDatabaseURL: "mysql://app:secret@db/app"}, key: "database_url (EFFECTIVELY_DATABASE_URL): a mysql:// URL: want a SQLite file"},
		{name: "SQLiteSchemeURL", yaml: "database_url: sqlite:///var/lib/app.db\n", key: "database_url (EFFECTIVELY_DATABASE_URL): a sqlite:// URL"},
		{name: "HTTPTransportURL", env: map[string]string{app.EnvTransportURL: "http://db/messages"}, key: "transport_url (EFFECTIVELY_TRANSPORT_URL): a http:// URL"},
		// The SQLite transport's messages on PostgreSQL: it ran SQLite's
		// statements there.
		{name: "SQLiteTransportOnPostgres", env: map[string]string{app.EnvTransportURL: "postgres://app:secret@db/messages"}, key: "transport_url (EFFECTIVELY_TRANSPORT_URL): the sqlite transport keeps its messages in a SQLite file"},
		{name: "TransportYAMLNamesKey", yaml: "transport: kafka\n", key: "transport (EFFECTIVELY_TRANSPORT): want sqlite"},
		// A mapping on one line, as the README writes breaker: its keys
		// were all named by the last one of the line.
		{name: "FlowUnknownKey", yaml: "defaults:\n  breaker: {failure: 5, cool_down: 30s}\n", key: "defaults.breaker.failure (line 2): field failure not found"},
		{name: "FlowUnknownKeyFirst", yaml: "defaults: {attempts: 3, retry_dealy: 1s, timeout: 30s}\n", key: "defaults.retry_dealy (line 1): field retry_dealy not found"},
		{name: "FlowBadValue", yaml: "defaults: {attempts: three, timeout: 30s}\n", key: "defaults.attempts (line 1): cannot unmarshal"},
		{name: "FlowBadDuration", yaml: "defaults: {timeout: soon, retry_delay: 1s}\n", key: "defaults.timeout (line 1): want a duration"},
		{name: "ValueBelowItsKey", yaml: "defaults:\n  attempts:\n    three\n", key: "defaults.attempts (line 3): cannot unmarshal"},
		{name: "FlowSameValue", yaml: "defaults: {attempts: x, timeout: x}\n", key: "defaults (line 1): "},
		// A list where a key wants one value: its items were on the line
		// too, and no key was named.
		{name: "ListForString", yaml: "transport: [sqlite]\n", key: "transport (line 1): cannot unmarshal !!seq into string"},
		{name: "ListBelowItsKey", yaml: "transport:\n  - sqlite\n", key: "transport (line 2): cannot unmarshal !!seq into string"},
		{name: "ListForInteger", yaml: "consumers:\n  a.b:\n    attempts: [1, 2]\n", key: "consumers.a.b.attempts (line 3): cannot unmarshal !!seq into int"},
		// The decoder reads the first document alone: the settings after
		// a "---" were ignored without a word.
		{name: "NullConsumerKey", yaml: "consumers:\n  ~:\n    attempts: 1\n", key: "line 2: consumers: a key that is null"},
		{name: "NullKeyInDefaults", yaml: "defaults:\n  null: 1\n", key: "line 2: defaults: a key that is null"},
		{name: "SecondDocument", yaml: "defaults:\n  attempts: 3\n---\ntransport: kafka\n", key: "line 4: a second YAML document (after ---)"},
		{name: "SecondDocumentAfterEmpty", yaml: "---\n---\ntransport: kafka\n", key: "line 3: a second YAML document"},
		{name: "SecondDocumentBroken", yaml: "transport: sqlite\n---\ntransport: [\n", key: app.EnvConfig},
		{name: "ListForMapping", yaml: "defaults: [1, 2]\n", key: "defaults (line 1): cannot unmarshal !!seq into middleware.Settings"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := app.LoadConfig(env(t, tt.yaml, tt.env))
			require.Error(t, err)
			require.ErrorContains(t, err, tt.key)
			require.NotContains(t, err.Error(), "secret", "a URL may hold a password")
			if tt.env[app.EnvTransportURL] == "" && !strings.Contains(tt.yaml, "transport_url") {
				require.NotContains(t, err.Error(), "transport_url (EFFECTIVELY_TRANSPORT_URL): ", "database_url's problem, said once")
			}
			require.Zero(t, cfg)
		})
	}

	// A name under consumers: with a newline or an escape sequence was
	// written into the error as it is: the newline split the key in
	// two ("consumers.a; b.attempts" once on one line), and the escape
	// reached the terminal.
	t.Run("OddConsumerNamePrintable", func(t *testing.T) {
		t.Parallel()
		const odd = "consumers:\n  \"a\\nb\\e[31m\":\n"
		for _, tt := range []struct {
			yaml string
			keys []string
		}{
			{odd + "    attempts: -1\n", []string{`consumers.a\nb\x1b[31m: consumer name`, `consumers.a\nb\x1b[31m.attempts: want 1 or more`}},
			{odd + "    attempts: three\n", []string{`consumers.a\nb\x1b[31m.attempts (line 3): cannot unmarshal`}},
			{odd + "    attempts: 1.5\n", []string{`consumers.a\nb\x1b[31m.attempts (line 3): want a whole number`}},
			{"consumers:\n  \"a\\u202eb\":\n    batch_linger: 1h\n", []string{`consumers.a\u202eb.batch_linger: want less than its timeout`}},
		} {
			_, err := app.LoadConfig(env(t, tt.yaml, nil))
			for _, key := range tt.keys {
				require.ErrorContains(t, err, key, tt.yaml)
			}
			require.NotContains(t, err.Error(), "\x1b", tt.yaml)
			require.NotContains(t, err.Error(), "a\nb", tt.yaml)
			require.NotContains(t, err.Error(), "\u202e", tt.yaml)
		}
	})

	t.Run("EmptyDocumentsAfterTheFirst", func(t *testing.T) {
		t.Parallel()
		for _, doc := range []string{"transport: memory\n---\n", "---\ntransport: memory\n...\n", "transport: memory\n---\n# nothing\n---\n~\n"} {
			cfg, err := app.LoadConfig(env(t, doc, nil))
			require.NoError(t, err, doc)
			require.Equal(t, app.TransportMemory, cfg.Transport, doc)
		}
	})

	t.Run("SQLiteFiles", func(t *testing.T) {
		t.Parallel()
		for _, u := range []string{"file:///var/lib/app.db", "file:./data/app.db?mode=rwc", "./data/app.db", "data/odd://name.db"} {
			cfg, err := app.LoadConfig(env(t, "", map[string]string{app.EnvDatabaseURL: u}))
			require.NoError(t, err, u)
			require.Equal(t, u, cfg.DatabaseURL)
		}
	})

	t.Run("EveryBadKeyNamed", func(t *testing.T) {
		t.Parallel()
		_, err := app.LoadConfig(env(t, "consumers:\n  a.b:\n    attempts: -1\n    concurrency: -1\n", map[string]string{
			app.EnvTablePrefix: "bad-prefix",
			app.EnvHTTPAddr:    "nope",
		}))
		for _, key := range []string{app.EnvTablePrefix, app.EnvHTTPAddr, "consumers.a.b.attempts", "consumers.a.b.concurrency"} {
			require.ErrorContains(t, err, key)
		}
	})
}

// smtpSettings and serviceSettings are a service's own settings, kept in
// the service: section of the configuration file.
type smtpSettings struct {
	Host string `yaml:"host"`
	Port int    `yaml:"port"`
}

type serviceSettings struct {
	SMTP       smtpSettings  `yaml:"smtp"`
	Recipients []string      `yaml:"recipients"`
	Timeout    app.Duration  `yaml:"timeout"`
	Greeting   string        `yaml:"greeting"`
	Backoff    time.Duration `yaml:"-"`
}

const serviceYAML = `transport: memory
defaults:
  attempts: 5
service:
  smtp:
    host: mail.example.com
    port: 2525
  recipients: [ops@example.com, oncall@example.com]
  timeout: 3s
`

func TestServiceSection(t *testing.T) {
	t.Parallel()

	t.Run("DecodesOverDefaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, serviceYAML, nil))
		require.NoError(t, err)
		require.Equal(t, 5, cfg.Settings("any.consumer").Attempts, "the framework's keys are read as before")
		settings := serviceSettings{Greeting: "hello", SMTP: smtpSettings{Port: 25}}
		require.NoError(t, cfg.DecodeService(&settings))
		require.Equal(t, serviceSettings{
			SMTP:       smtpSettings{Host: "mail.example.com", Port: 2525},
			Recipients: []string{"ops@example.com", "oncall@example.com"},
			Timeout:    app.Duration(3 * time.Second),
			Greeting:   "hello", // the default, not in the file
		}, settings)
	})

	t.Run("ServiceConfig", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, serviceYAML, nil))
		require.NoError(t, err)
		settings, err := app.ServiceConfig[serviceSettings](cfg)
		require.NoError(t, err)
		require.Equal(t, "mail.example.com", settings.SMTP.Host)
	})

	t.Run("MissingLeavesDefaults", func(t *testing.T) {
		t.Parallel()
		for _, yaml := range []string{"", "transport: memory\n", "service:\n"} {
			cfg, err := app.LoadConfig(env(t, yaml, nil))
			require.NoError(t, err)
			settings := serviceSettings{Greeting: "hello"}
			require.NoError(t, cfg.DecodeService(&settings), "%q", yaml)
			require.Equal(t, serviceSettings{Greeting: "hello"}, settings, "%q", yaml)
		}
	})

	t.Run("BadKeyNamed", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name, yaml, key string
		}{
			{"UnknownKey", "transport: memory\nservice:\n  smtp:\n    hots: mail.example.com\n", "service.smtp.hots (line 4)"},
			{"WrongType", "service:\n  smtp:\n    port: twenty-five\n", "service.smtp.port (line 3)"},
			{"BadDuration", "service:\n  timeout: soon\n", "service.timeout (line 2)"},
			{"NotAMapping", "service: 42\n", "service (line 1)"},
			{"Fraction", "service:\n  smtp:\n    port: 25.5\n", "service.smtp.port (line 3): want a whole number, got \"25.5\""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				cfg, err := app.LoadConfig(env(t, tt.yaml, nil))
				require.NoError(t, err, "the framework leaves the section to the service")
				var settings serviceSettings
				err = cfg.DecodeService(&settings)
				require.ErrorContains(t, err, tt.key)
				require.ErrorContains(t, err, app.EnvConfig)
			})
		}
	})

	t.Run("WantsAPointer", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, serviceYAML, nil))
		require.NoError(t, err)
		require.ErrorContains(t, cfg.DecodeService(serviceSettings{}), "pointer")
		require.ErrorContains(t, cfg.DecodeService((*serviceSettings)(nil)), "pointer")
	})

	// A service: section that nothing decodes stops the service before it
	// starts: its settings, typos included, were ignored without a word.
	t.Run("UndecodedRefusedAtStart", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name   string
			decode fx.Option
		}{
			{"Undecoded", fx.Options()},
			{"Decoded", fx.Options(fx.Provide(app.ServiceConfig[serviceSettings]), fx.Invoke(func(serviceSettings) {}))},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				cfg, err := app.LoadConfig(env(t, serviceYAML, map[string]string{
					app.EnvDatabaseURL: filepath.Join(t.TempDir(), "app.db"), app.EnvAutoMigrate: "true", app.EnvHTTPAddr: "",
				}))
				require.NoError(t, err)
				service := app.New(handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
					fx.Supply(widgetMigrations), fx.Replace(cfg), tt.decode)
				if tt.name == "Undecoded" {
					require.ErrorContains(t, service.Err(), "service: the service decodes no service: section")
					return // New closed what it opened
				}
				require.NoError(t, service.Err())
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				defer cancel()
				require.NoError(t, service.Start(ctx))
				require.NoError(t, service.Stop(ctx))
			})
		}
	})

	t.Run("OtherUnknownTopLevelKeysStillRefused", func(t *testing.T) {
		t.Parallel()
		_, err := app.LoadConfig(env(t, "servcie:\n  smtp: {}\n", nil))
		require.ErrorContains(t, err, "servcie")
	})
}

func TestCheckConsumers(t *testing.T) {
	t.Parallel()
	declared := []handlers.Declaration{
		{Name: "b.projector", Handlers: 2},
		{Name: "a.reminder", Handlers: 1, RenamedFrom: []string{"a.old-reminder"}},
	}
	settings := func(names ...string) app.Config {
		cfg := app.Config{Consumers: map[string]middleware.Settings{}}
		for _, n := range names {
			cfg.Consumers[n] = middleware.Settings{Attempts: 2}
		}
		return cfg
	}

	t.Run("DeclaredAndRenamedFromPass", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, settings("a.reminder", "b.projector", "a.old-reminder").CheckConsumers(declared))
		require.NoError(t, settings().CheckConsumers(nil))
	})

	t.Run("UnknownRefusedNamingEachKey", func(t *testing.T) {
		t.Parallel()
		err := settings("a.reminder", "a.remindr", "c.gone").CheckConsumers(declared)
		require.EqualError(t, err, "configuration: "+
			"consumers.a.remindr: no consumer of this service has that name (declared: a.reminder, b.projector)\n"+
			"consumers.c.gone: no consumer of this service has that name (declared: a.reminder, b.projector)")
		require.ErrorContains(t, settings("x.y").CheckConsumers(nil), "consumers.x.y: no consumer of this service has that name (declared: none)")
	})

	t.Run("StartRefused", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Consumers = map[string]middleware.Settings{"widgets.count-on-widget-addded": {Attempts: 2}}
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
		)
		require.ErrorContains(t, service.Err(), "consumers.widgets.count-on-widget-addded: no consumer of this service has that name (declared: "+consumerName+")")
	})

	t.Run("ConfigInCodeChecked", func(t *testing.T) {
		t.Parallel()
		// A configuration given with fx.Replace is checked as one loaded
		// from the environment: start-up stops naming each bad key.
		cfg := testConfig(t)
		cfg.Defaults.Concurrency = 5000
		cfg.Consumers = map[string]middleware.Settings{consumerName: {
			Timeout: time.Second, BatchLinger: 2 * time.Second,
		}}
		cfg.OutboxRetention = app.Duration(-time.Hour)
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
		)
		err := service.Err()
		require.ErrorContains(t, err, "defaults.concurrency: want 1..1024, got 5000")
		require.ErrorContains(t, err, "consumers."+consumerName+".batch_linger: want less than its timeout")
		require.ErrorContains(t, err, "outbox_retention: must not be negative")

		cfg = testConfig(t)
		cfg.Transport = "kafka"
		require.ErrorContains(t, app.New(fx.Replace(cfg)).Err(), `transport (EFFECTIVELY_TRANSPORT): want sqlite, postgres, amqp or memory, got "kafka"`)
	})

	t.Run("StartAcceptsRenamedFrom", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Consumers = map[string]middleware.Settings{"widgets.old-name": {Attempts: 2}, consumerName: {Attempts: 3}}
		service := app.New(
			handlers.Register(consumerName, handlers.RenamedFrom("widgets.old-name"), handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
		)
		require.NoError(t, service.Err())
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, service.Start(ctx))
		require.NoError(t, service.Stop(ctx))
	})
}

// TestLoadConfigAMQPBrokers: EFFECTIVELY_AMQP_URL and amqp_url take the
// URLs of several nodes of one cluster, comma-separated (in YAML a list
// too); each is checked, and an error names the key and the URL's
// position, never its password.
func TestLoadConfigAMQPBrokers(t *testing.T) {
	t.Parallel()
	const one, two = "amqp://app:pw-4711@rabbit-1:5672/", "amqp://app:pw-4711@rabbit-2:5672/"
	amqpEnv := func(url string) map[string]string {
		m := map[string]string{app.EnvTransport: "amqp"}
		if url != "" {
			m[app.EnvAMQPURL] = url
		}
		return m
	}
	for name, tc := range map[string]struct {
		yaml string
		env  map[string]string
		want string
	}{
		"Env":          {env: amqpEnv(one + "," + two), want: one + "," + two},
		"YAMLString":   {yaml: "amqp_url: " + one + "," + two + "\n", env: amqpEnv(""), want: one + "," + two},
		"YAMLList":     {yaml: "amqp_url:\n  - " + one + "\n  - " + two + "\n", env: amqpEnv(""), want: one + "," + two},
		"EnvOverYAML":  {yaml: "amqp_url: [" + one + "]\n", env: amqpEnv(two), want: two},
		"DefaultOne":   {env: amqpEnv(""), want: app.DefaultAMQPURL},
		"NotCheckedOn": {yaml: "amqp_url: [http://x]\n", want: "http://x"}, // sqlite
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := app.LoadConfig(env(t, tc.yaml, tc.env))
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.AMQPURL)
		})
	}
	for name, tc := range map[string]struct {
		yaml string
		env  map[string]string
		want string
	}{
		"Scheme":        {env: amqpEnv(one + ",http://app:pw-4711@rabbit-2/"), want: "URL 2 of 2: must start with amqp://"},
		"Empty":         {env: amqpEnv(one + ",," + two), want: "URL 2 of 3: empty"},
		"OtherPassword": {env: amqpEnv(one + ",amqp://app:pw-0000@rabbit-2/"), want: "URL 2 of 2: only the host and port may differ"},
		"YAMLList":      {yaml: "amqp_url: [" + one + ", 'amqp://app:pw-4711@rabbit-2:port/']\n", env: amqpEnv(""), want: "URL 2 of 2: not a valid AMQP URL"},
		"YAMLNotAList":  {yaml: "amqp_url: {a: b}\n", env: amqpEnv(""), want: "amqp_url"},
	} {
		t.Run("Bad"+name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, tc.yaml, tc.env))
			require.ErrorContains(t, err, tc.want)
			if !strings.HasPrefix(name, "YAMLNotAList") {
				require.ErrorContains(t, err, app.EnvAMQPURL)
			}
			require.NotContains(t, err.Error(), "pw-")
		})
	}
}

// TestLoadConfigAMQPQueueType: amqp_queue_type (EFFECTIVELY_AMQP_QUEUE_TYPE)
// is classic or quorum; with quorum queues amqp_delivery_limit, RabbitMQ's
// x-delivery-limit, must be above every consumer's max_deliveries, so
// that the framework dead-letters a message before RabbitMQ drops it.
func TestLoadConfigAMQPQueueType(t *testing.T) {
	t.Parallel()
	onAMQP := func(vars map[string]string) map[string]string {
		vars[app.EnvTransport] = "amqp"
		return vars
	}
	for name, tc := range map[string]struct {
		yaml  string
		env   map[string]string
		want  string
		limit int
	}{
		"DefaultClassic":   {env: onAMQP(map[string]string{}), want: ""},
		"Env":              {env: onAMQP(map[string]string{app.EnvAMQPQueueType: "quorum"}), want: "quorum"},
		"YAML":             {yaml: "amqp_queue_type: quorum\namqp_delivery_limit: 11\n", env: onAMQP(map[string]string{}), want: "quorum", limit: 11},
		"EnvOverYAML":      {yaml: "amqp_queue_type: quorum\n", env: onAMQP(map[string]string{app.EnvAMQPQueueType: "classic"}), want: "classic"},
		"ClassicAnyLimit":  {yaml: "amqp_delivery_limit: 3\n", env: onAMQP(map[string]string{}), want: "", limit: 3},
		"AboveConsumer":    {yaml: "amqp_queue_type: quorum\namqp_delivery_limit: 51\nconsumers:\n  a.b:\n    max_deliveries: 50\n", env: onAMQP(map[string]string{}), want: "quorum", limit: 51},
		"NotCheckedOnSQLi": {yaml: "amqp_queue_type: stream\n", want: "stream"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := app.LoadConfig(env(t, tc.yaml, tc.env))
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.AMQPQueueType)
			require.Equal(t, tc.limit, cfg.AMQPDeliveryLimit)
		})
	}
	for name, tc := range map[string]struct {
		yaml string
		env  map[string]string
		want []string
	}{
		"Type": {env: onAMQP(map[string]string{app.EnvAMQPQueueType: "stream"}), want: []string{app.EnvAMQPQueueType, "classic or quorum"}},
		"LimitAtDefaults": {
			yaml: "amqp_queue_type: quorum\namqp_delivery_limit: 10\n", env: onAMQP(map[string]string{}),
			want: []string{"amqp_delivery_limit: want more than defaults.max_deliveries (10)"},
		},
		"LimitBelowConsumer": {
			yaml: "amqp_queue_type: quorum\namqp_delivery_limit: 40\ndefaults:\n  max_deliveries: 5\nconsumers:\n  a.b:\n    max_deliveries: 40\n  a.c:\n    attempts: 2\n",
			env:  onAMQP(map[string]string{}),
			want: []string{"consumers.a.b.max_deliveries (40)"},
		},
		"DefaultLimitBelowConsumer": {
			yaml: "amqp_queue_type: quorum\nconsumers:\n  a.b:\n    max_deliveries: 2000000\n", env: onAMQP(map[string]string{}),
			want: []string{"consumers.a.b.max_deliveries (2000000)", "got 1000000"},
		},
		"NegativeLimit": {yaml: "amqp_queue_type: quorum\namqp_delivery_limit: -1\n", env: onAMQP(map[string]string{}), want: []string{"amqp_delivery_limit: want 1.."}},
	} {
		t.Run("Bad"+name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, tc.yaml, tc.env))
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), "consumers.a.c", "a consumer below the limit")
		})
	}
}

// TestServeAMQPQueueType: amqp_queue_type reaches the transport. The
// widget consumer's queue exists as a classic queue, so a service that
// declares it as a quorum queue fails at start with RabbitMQ's refusal:
// a queue's type cannot change (docs/transports.md, "Switching a queue's
// type").
func TestServeAMQPQueueType(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.Require(t, testenv.AMQPURLVar)
	conn, err := amqp091.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(consumerName, true, false, false, false, nil) // as the other tests have it
	require.NoError(t, err)

	cfg := testConfig(t)
	cfg.Transport = app.TransportAMQP
	cfg.AMQPURL = amqpURL
	cfg.AMQPQueueType = "quorum"
	service := app.New(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
	)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	err = app.Serve(ctx, service)
	require.ErrorContains(t, err, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '"+consumerName+"'")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "refused at start")
}

// TestServeAMQPQuorumQueue: with amqp_queue_type quorum the service
// declares its consumer's queue as a durable quorum queue whose
// x-delivery-limit is amqp_delivery_limit. On the shared broker, under a
// consumer name of the test's own (the widget consumer's queue is
// classic there): RabbitMQ refuses a declare whose durability, type or
// x-delivery-limit differ from the queue's (PRECONDITION_FAILED), so once
// the service declared the queue, a declare as the test expects it must
// pass, and one with another type or limit must not.
func TestServeAMQPQuorumQueue(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.Require(t, testenv.AMQPURLVar)
	name := "widgets.quorum-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() { deleteQueues(t, amqpURL, name) })
	cfg := testConfig(t)
	cfg.Transport = app.TransportAMQP
	cfg.AMQPURL = amqpURL
	cfg.AMQPQueueType = "quorum"
	cfg.AMQPDeliveryLimit = 77
	service := app.New(
		handlers.Register(name, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- app.Serve(ctx, service) }()

	conn, err := amqp091.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	// declare declares the queue (passively: only that it exists) on a
	// channel of its own: the broker closes a channel that it refuses.
	declare := func(passive bool, args amqp091.Table) error {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		if passive {
			_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
		} else {
			_, err = ch.QueueDeclare(name, true, false, false, false, args)
		}
		return err
	}
	require.Eventually(t, func() bool { return declare(true, nil) == nil }, 2*waitLimit, 50*time.Millisecond, "the service declared its queue")
	require.NoError(t, declare(false, amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(77)}),
		"the service's queue is a durable quorum queue with x-delivery-limit 77")
	for _, other := range []struct {
		args amqp091.Table
		arg  string
	}{
		{amqp091.Table{"x-queue-type": "classic", "x-delivery-limit": int64(77)}, "x-queue-type"},
		{amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(78)}, "x-delivery-limit"},
		{amqp091.Table{"x-queue-type": "quorum"}, "x-delivery-limit"},
	} {
		require.ErrorContains(t, declare(false, other.args), "PRECONDITION_FAILED - inequivalent arg '"+other.arg+"'", "declared with %v", other.args)
	}
	cancel()
	require.NoError(t, <-served)
}

// TestLoadConfigNamesEachProblemOnce: a bad value of the defaults:
// section is named there, not again under each consumer that takes it;
// a consumer's own bad value, or one that its own settings make bad, is
// named under the consumer.
func TestLoadConfigNamesEachProblemOnce(t *testing.T) {
	t.Parallel()
	_, err := app.LoadConfig(env(t, `
defaults:
  attempts: -1
  batch_linger: 2s
consumers:
  a.b:
    retry_delay: 1s
  c.d:
    concurrency: 5000
    timeout: 2s
`, nil))
	require.ErrorContains(t, err, "defaults.attempts: want 1 or more, got -1")
	require.NotContains(t, err.Error(), "consumers.a.b", "a.b has the defaults' problems only")
	require.NotContains(t, err.Error(), "consumers.c.d.attempts")
	require.ErrorContains(t, err, "consumers.c.d.concurrency: want 1..1024, got 5000")
	require.ErrorContains(t, err, "consumers.c.d.batch_linger: want less than its timeout (2s)", "its own timeout makes the defaults' linger too long")
	require.NotContains(t, err.Error(), "defaults.batch_linger", "2s is less than the default timeout")
}

// TestOperationsConfigSnippets loads each YAML snippet of
// docs/operations.md that sets consumers' settings (those that start with
// consumers: or defaults:, list items' included) as the service would,
// so that a key the page shows is one the configuration takes, within
// its range.
func TestOperationsConfigSnippets(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?ms)^( *)```yaml\n(.*?)^ *```").FindAllSubmatch(doc, -1)
	n := 0
	for _, b := range blocks {
		indent := string(b[1])
		lines := strings.Split(string(b[2]), "\n")
		for i, line := range lines {
			lines[i] = strings.TrimPrefix(line, indent)
		}
		snippet := strings.Join(lines, "\n")
		if !strings.HasPrefix(snippet, "consumers:") && !strings.HasPrefix(snippet, "defaults:") {
			continue
		}
		n++
		_, err := app.LoadConfig(env(t, snippet, nil)) // which validates it
		require.NoError(t, err, "docs/operations.md:\n%s", snippet)
	}
	require.GreaterOrEqual(t, n, 2, "docs/operations.md's consumer settings: the circuit breaker's and group commit's")
}
