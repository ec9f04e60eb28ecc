package sqlstore

import (
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMigrations(t *testing.T) {
	t.Parallel()
	for _, d := range []Dialect{Postgres, SQLite} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			fsys, err := Migrations(d, "acme_")
			require.NoError(t, err)
			names, err := fs.Glob(fsys, "*.sql")
			require.NoError(t, err)
			require.NotEmpty(t, names)
			var all strings.Builder
			for _, name := range names {
				b, err := fs.ReadFile(fsys, name)
				require.NoError(t, err)
				text := string(b)
				require.NotContains(t, text, "{{")
				require.Contains(t, text, "-- +goose Up")
				require.NotContains(t, strings.ReplaceAll(text, "acme_", ""), "acme")
				all.WriteString(text)
			}
			for _, table := range []string{
				"processed_events", "dead_letters", "outbox", "subject_checkpoints", "parked_events", "deliveries",
				"dead_letter_history", "replays", "purge_horizons", "leases",
				"consumer_members", "partition_leases",
			} {
				require.Contains(t, all.String(), "CREATE TABLE IF NOT EXISTS acme_"+table+" (", "some migration creates %s", table)
			}
		})
	}

	_, err := Migrations("oracle", "")
	require.Error(t, err)
	_, err = Migrations(SQLite, "Bad")
	require.Error(t, err)
}

func TestDialectOf(t *testing.T) {
	t.Parallel()
	for driver, want := range map[string]Dialect{"pgx": Postgres, "postgres": Postgres, "sqlite": SQLite, "sqlite3": SQLite} {
		got, err := DialectOf(driver)
		require.NoError(t, err)
		require.Equal(t, want, got, driver)
	}
	_, err := DialectOf("mysql")
	require.ErrorContains(t, err, "mysql")
}

func TestQueriesUseThePrefixAndDialect(t *testing.T) {
	t.Parallel()
	pg := newQueries(Postgres, "p_").sql(qMarkPostgres)
	require.Contains(t, pg, "INSERT INTO p_processed_events")
	require.Contains(t, pg, "FROM p_dead_letters")
	require.Contains(t, pg, "$4")
	require.NotContains(t, pg, "?")
	lite := newQueries(SQLite, "").sql(qForgetDelivery)
	require.Contains(t, lite, "DELETE FROM deliveries")
	require.Contains(t, lite, "?")
	require.NotContains(t, lite, "{p}")
}

func TestValueRows(t *testing.T) {
	t.Parallel()
	require.Equal(t, "(?)", valueRows(1, 1))
	require.Equal(t, "(?, ?, ?, ?)", valueRows(1, 4))
	require.Equal(t, "(?, ?), (?, ?), (?, ?)", valueRows(3, 2))
}

// TestTimeArgHeldToInt64: on SQLite a time beyond what int64 nanoseconds
// hold is the nearest one they do, so that it compares on its side of
// every stored time: UnixNano wrapped 9999-12-31 around to before 1970.
func TestTimeArgHeldToInt64(t *testing.T) {
	t.Parallel()
	stored := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).UnixNano()
	for _, tt := range []struct {
		at    time.Time
		after bool
	}{
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), true},
		{time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Date(1677, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{time.Time{}.Add(time.Nanosecond), false},
	} {
		n, ok := SQLite.timeArg(tt.at).(int64)
		require.True(t, ok)
		require.Equal(t, tt.after, n > stored, "%s", tt.at)
	}
	require.Equal(t, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), Postgres.timeArg(time.Date(2026, 1, 2, 1, 0, 0, 0, time.FixedZone("", 3600))))
}
