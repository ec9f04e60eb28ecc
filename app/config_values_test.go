package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// TestLoadConfigRefuses: values that were accepted, and failed later or
// did harm without naming their key, stop loading with an error that
// names it: white space around a database's URL (SQLite took it for a
// path, and created folders named after the URL, password included), a
// NUL byte in a SQLite URL (the driver cut the path there), an in-memory
// SQLite database (each connection of the pool had its own, empty), the
// purge's, the outbox's and the consumers' durations and rate below
// their bounds, a table prefix that SQLite reserves, and an AMQP delivery
// limit out of range on any transport.
func TestLoadConfigRefuses(t *testing.T) {
	t.Parallel()
	const (
		databaseURL  = "database_url (EFFECTIVELY_DATABASE_URL): "
		transportURL = "transport_url (EFFECTIVELY_TRANSPORT_URL): "
		space        = "begins or ends with white space"
		memory       = "an in-memory SQLite database"
	)
	for _, tt := range []struct {
		name string
		yaml string
		env  map[string]string
		want string
	}{
		{name: "DatabaseURLLeadingSpace", env: map[string]string{app.EnvDatabaseURL: " postgres://u:secret@127.0.0.1/db"}, want: databaseURL + space},
		{name: "DatabaseURLOnlySpace", env: map[string]string{app.EnvDatabaseURL: " "}, want: databaseURL + space},
		{name: "DatabaseURLTrailingSpace", env: map[string]string{app.EnvDatabaseURL: "./data/app.db "}, want: databaseURL + space},
		{name: "DatabaseURLTrailingTabYAML", yaml: "database_url: \"file:./data/app.db\\t\"\n", want: databaseURL + space},
		{name: "DatabaseURLTrailingNewlineYAML", yaml: "database_url: |\n  ./data/app.db\n", want: databaseURL + space},
		{name: "PostgresURLTrailingSpace", env: map[string]string{app.EnvTransport: "postgres", app.EnvDatabaseURL: "postgres://u:secret@127.0.0.1/db "}, want: databaseURL + space},
		{name: "TransportURLLeadingSpace", env: map[string]string{app.EnvTransportURL: " ./data/messages.db"}, want: transportURL + space},
		{name: "HTTPAddrLeadingSpace", env: map[string]string{app.EnvHTTPAddr: " 127.0.0.1:9464"}, want: `http_addr (EFFECTIVELY_HTTP_ADDR): want host:port, without white space around it, got " 127.0.0.1:9464"`},
		{name: "HTTPAddrTrailingNewline", env: map[string]string{app.EnvHTTPAddr: "127.0.0.1:9464\n"}, want: `http_addr (EFFECTIVELY_HTTP_ADDR): want host:port, without white space around it, got "127.0.0.1:9464\n"`},
		{name: "SQLiteURLNul", yaml: "database_url: \"file:./data/app.db\\0junk\"\n", want: databaseURL + "holds a NUL byte"},
		{name: "TransportURLNul", env: map[string]string{app.EnvTransportURL: "./data/m.db\x00x"}, want: transportURL + "holds a NUL byte"},
		{name: "Memory", env: map[string]string{app.EnvDatabaseURL: ":memory:"}, want: databaseURL + memory},
		{name: "FileMemory", env: map[string]string{app.EnvDatabaseURL: "file::memory:"}, want: databaseURL + memory},
		{name: "FileMemoryShared", env: map[string]string{app.EnvDatabaseURL: "file::memory:?cache=shared"}, want: databaseURL + memory},
		{name: "FileMemoryEscaped", env: map[string]string{app.EnvDatabaseURL: "file:%3Amemory%3A"}, want: databaseURL + memory},
		{name: "ModeMemory", yaml: "database_url: file:app.db?mode=memory&cache=shared\n", want: databaseURL + memory},
		{name: "VFSMemDB", env: map[string]string{app.EnvDatabaseURL: "file:/app.db?vfs=memdb"}, want: databaseURL + memory},
		{name: "EmptyFilePath", env: map[string]string{app.EnvDatabaseURL: "file:"}, want: databaseURL + memory},
		{name: "EmptyFilePathWithQuery", env: map[string]string{app.EnvDatabaseURL: "file:?_txlock=deferred"}, want: databaseURL + memory},
		{name: "TransportURLMemory", env: map[string]string{app.EnvTransportURL: ":memory:"}, want: transportURL + memory},
		{name: "PurgeInterval", yaml: "purge_interval: 1ns\n", want: "purge_interval: want at least 10ms (or nothing: the default), got 1ns"},
		{name: "PurgeIntervalNegative", yaml: "purge_interval: -1s\n", want: "purge_interval: must not be negative"},
		{name: "OutboxBatchTimeout", yaml: "outbox_batch_timeout: 1ns\n", want: "outbox_batch_timeout: want at least 10ms (or nothing: the default), got 1ns"},
		{name: "OutboxBatchTimeoutTooLong", yaml: "outbox_batch_timeout: 2000000h\n", want: "outbox_batch_timeout: want at most 24h0m0s (or nothing: the default), got 2000000h0m0s"},
		{name: "OutboxRetention", yaml: "outbox_retention: 59s\n", want: "outbox_retention: want at least 1m0s (or nothing: the default), got 59s"},
		{name: "ReplayRetention", yaml: "replay_retention: 1ns\n", want: "replay_retention: want at least 1m0s (or nothing: the default), got 1ns"},
		{name: "DeadLetterRetention", yaml: "dead_letter_retention: 1ns\n", want: "dead_letter_retention: want at least 1m0s (or nothing: the default), got 1ns"},
		{name: "TransportRetention", yaml: "transport_retention: 1s\n", want: "transport_retention: want at least 1m0s (or nothing: the default), got 1s"},
		{name: "RateLimit", yaml: "defaults:\n  rate_limit: 1e-300\n", want: "defaults.rate_limit: want 0 (no limit) or at least 0.000278 messages a second (one an hour"},
		{name: "ConsumerRateLimit", yaml: "consumers:\n  a.b:\n    rate_limit: 0.0002\n", want: "consumers.a.b.rate_limit: want 0 (no limit) or at least"},
		{name: "Timeout", yaml: "consumers:\n  a.b:\n    timeout: 1ns\n", want: "consumers.a.b.timeout: want at least 1ms"},
		{name: "DefaultsTimeout", yaml: "defaults:\n  timeout: 999us\n", want: "defaults.timeout: want at least 1ms"},
		{name: "GapTimeout", yaml: "consumers:\n  a.b:\n    strict_order: true\n    gap_timeout: 1ns\n", want: "consumers.a.b.gap_timeout: want at least 1ms"},
		{name: "TablePrefixSQLite", env: map[string]string{app.EnvTablePrefix: "sqlite_"}, want: `table_prefix (EFFECTIVELY_TABLE_PREFIX): SQLite reserves the names that begin with sqlite_ for its own tables, so the migrations would fail, got "sqlite_"`},
		{name: "TablePrefixSQLiteLonger", yaml: "table_prefix: sqlite_app_\n", want: "table_prefix (EFFECTIVELY_TABLE_PREFIX): SQLite reserves"},
		{name: "TablePrefixSQLiteTransport", env: map[string]string{app.EnvTablePrefix: "sqlite_", app.EnvDatabaseURL: "postgres://u:secret@db/app"}, want: "table_prefix (EFFECTIVELY_TABLE_PREFIX): SQLite reserves"},
		{name: "TablePrefixUpperSQLite", env: map[string]string{app.EnvTablePrefix: "SQLITE_"}, want: "table_prefix (EFFECTIVELY_TABLE_PREFIX): "},
		{name: "DeliveryLimitNegativeOnSQLite", yaml: "amqp_delivery_limit: -5\n", want: "amqp_delivery_limit: want 1..2147483647 (or nothing: 1000000), got -5"},
		{name: "DeliveryLimitTooLargeOnPostgres", yaml: "amqp_delivery_limit: 3000000000\n", env: map[string]string{app.EnvTransport: "postgres", app.EnvDatabaseURL: "postgres://u:secret@db/app"}, want: "amqp_delivery_limit: want 1..2147483647"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := app.LoadConfig(env(t, tt.yaml, tt.env))
			require.ErrorContains(t, err, tt.want)
			require.NotContains(t, err.Error(), "secret", "a URL may hold a password")
			require.Zero(t, cfg)
		})
	}
}

// TestLoadConfigAcceptsBounds: the least value of each bound, and what a
// bound leaves alone, load.
func TestLoadConfigAcceptsBounds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		yaml string
		env  map[string]string
	}{
		{name: "Durations", yaml: "purge_interval: 10ms\noutbox_batch_timeout: 10ms\noutbox_retention: 1m\nreplay_retention: 1m\ndead_letter_retention: 1m\ntransport_retention: 1m\n"},
		{name: "OutboxBatchTimeoutMost", yaml: "outbox_batch_timeout: 24h\n"},
		{name: "ConsumerBounds", yaml: "defaults:\n  timeout: 1ms\n  gap_timeout: 1ms\n  rate_limit: 0.00027778\n"},
		{name: "RateLimitOff", yaml: "defaults:\n  rate_limit: 0\n"},
		{name: "SQLiteFileWithMode", env: map[string]string{app.EnvDatabaseURL: "file:./data/app.db?mode=rwc&cache=shared"}},
		{name: "SQLitePathWithSpaceInside", env: map[string]string{app.EnvDatabaseURL: "./my data/app.db"}},
		{name: "PrefixLikeSQLite", env: map[string]string{app.EnvTablePrefix: "sqlitex_"}},
		{name: "SQLitePrefixOffSQLite", env: map[string]string{app.EnvTransport: "postgres", app.EnvDatabaseURL: "postgres://u:p@db/app", app.EnvTablePrefix: "sqlite_"}},
		{name: "DeliveryLimitOnSQLite", yaml: "amqp_delivery_limit: 5\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, tt.yaml, tt.env))
			require.NoError(t, err)
		})
	}
}

// TestLoadConfigQuotesValuesCut: an error that quotes a value of the
// user's quotes its first bytes, Go-quoted, and says how long it is: a
// table_prefix of a megabyte made an error line of a megabyte, and a
// control character or an escape sequence in a value, a key or a
// consumer's name reached the terminal as it was.
func TestLoadConfigQuotesValuesCut(t *testing.T) {
	t.Parallel()
	// Long values, and under -race a YAML parse of 1 MiB cost 20 s of
	// CPU: 128 KiB is as far past the cut.
	long := strings.Repeat("a", 1<<17)
	const escape = "\x1b[2J\x1b[31m" // 9 bytes
	zeros := strings.Repeat("0", 1<<17)
	for _, tt := range []struct {
		name string
		yaml string
		env  map[string]string
		want string
	}{
		{name: "TablePrefix", env: map[string]string{app.EnvTablePrefix: long}, want: `table_prefix (EFFECTIVELY_TABLE_PREFIX): want at most 30 bytes, got "` + long[:64] + `"… (131072 bytes)`},
		{name: "TablePrefixEscape", env: map[string]string{app.EnvTablePrefix: escape}, want: `table_prefix (EFFECTIVELY_TABLE_PREFIX): `},
		{name: "Transport", env: map[string]string{app.EnvTransport: long + escape}, want: `transport (EFFECTIVELY_TRANSPORT): want sqlite, postgres, amqp or memory, got "` + long[:64] + `"… (131081 bytes)`},
		{name: "TransportEscape", env: map[string]string{app.EnvTransport: escape}, want: `got "\x1b[2J\x1b[31m"`},
		{name: "AutoMigrate", env: map[string]string{app.EnvAutoMigrate: escape + long}, want: `EFFECTIVELY_AUTO_MIGRATE: want true or false, got "\x1b[2J\x1b[31m` + long[:55] + `"… (131081 bytes)`},
		{name: "Console", env: map[string]string{app.EnvConsole: escape + long}, want: `EFFECTIVELY_CONSOLE: want true or false, got "\x1b[2J\x1b[31m` + long[:55] + `"… (131081 bytes)`},
		{name: "HTTPAddr", env: map[string]string{app.EnvHTTPAddr: long}, want: `got "` + long[:64] + `"… (131072 bytes)`},
		{name: "QueueType", env: map[string]string{app.EnvTransport: "amqp", app.EnvAMQPQueueType: long}, want: `amqp_queue_type (EFFECTIVELY_AMQP_QUEUE_TYPE): want classic or quorum, got "` + long[:64] + `"…`},
		{name: "DropUnroutable", yaml: "outbox_drop_unroutable: [\"" + strings.Repeat(" ", 100) + "\"]\n", want: `outbox_drop_unroutable[0]: want an event type, got "` + strings.Repeat(" ", 64) + `"… (100 bytes)`},
		{name: "Duration", yaml: "processed_retention: " + long + "\n", want: `processed_retention (line 1): want a duration such as 500ms or 2s, got "` + long[:64] + `"… (131072 bytes)`},
		{name: "ConsumerDuration", yaml: "defaults:\n  timeout: \"\\e[2J" + long + "\"\n", want: `defaults.timeout (line 2): want a duration such as 500ms or 2s, got "\x1b[2J`},
		{name: "Fraction", yaml: "amqp_prefetch: 1.5" + zeros + "\n", want: `amqp_prefetch (line 1): want a whole number, got "1.5` + zeros[:61] + `"… (131075 bytes)`},
		{name: "UnknownKey", yaml: "? " + long + "\n: 1\n", want: long[:64] + `… (131072 bytes) (line 1): field ` + long[:64] + `… (131072 bytes) not found in type app.Config`},
		{name: "UnknownKeyEscape", yaml: "\"k\\e[2J\": 1\n", want: `k\x1b[2J (line 1): field k\x1b[2J not found`},
		{name: "ValueOfWrongTypeEscape", yaml: "defaults:\n  attempts: \"\\e[2J\"\n", want: `defaults.attempts (line 2): cannot unmarshal !!str `},
		{name: "ConsumerName", yaml: "consumers:\n  ? " + long + "\n  : {attempts: -1}\n", want: "consumers." + long[:64] + "… (131072 bytes).attempts: want 1 or more"},
		{name: "NullKey", yaml: "consumers:\n  ? " + long + "\n  : {~: 1}\n", want: "line 3: consumers." + long[:64] + "… (131072 bytes): a key that is null"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, tt.yaml, tt.env))
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.Less(t, len(err.Error()), 2000, "the value is cut")
			require.NotContains(t, err.Error(), "\x1b", "an escape sequence is quoted")
		})
	}
}

// TestLoadConfigFile: EFFECTIVELY_CONFIG must name a regular file of at
// most app.MaxConfigFileBytes; /dev/zero was read until the process ran
// out of memory, a directory said only "is a directory".
func TestLoadConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	large := filepath.Join(dir, "large.yaml")
	f, err := os.Create(large)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(app.MaxConfigFileBytes+1)) // sparse: no disk
	require.NoError(t, f.Close())
	link := filepath.Join(dir, "link.yaml")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "real.yaml"), []byte("transport: memory\n"), 0o600))
	require.NoError(t, os.Symlink("real.yaml", link))

	for _, tt := range []struct {
		name, path, want string
	}{
		{"Directory", dir, app.EnvConfig + ": " + dir + " is a directory, not a regular file"},
		{"Device", os.DevNull, app.EnvConfig + ": " + os.DevNull + " is a device, not a regular file"},
		{"TooLarge", large, app.EnvConfig + ": " + large + " is 16777217 bytes, larger than 16777216 (16 MiB)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: tt.path}))
			require.ErrorContains(t, err, tt.want)
		})
	}
	t.Run("Link", func(t *testing.T) {
		t.Parallel()
		cfg, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: link}))
		require.NoError(t, err)
		require.Equal(t, app.TransportMemory, cfg.Transport)
	})
}
