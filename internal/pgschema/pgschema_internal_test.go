package pgschema

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestWithSearchPath: the schema's URL is the base with its search_path,
// several hosts included, which net/url does not always read.
func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	for _, base := range []string{
		"postgres://app:pw-4711@db:5432/app",
		"postgres://app:pw-4711@db:5432/app?sslmode=disable",
		"postgres://app:pw-4711@db-1,db-2:5433/app?target_session_attrs=read-write",
		"postgres://app:pw-4711@db-1:5432,db-2/app", // net/url refuses it
		"postgres://app:pw-4711@db:5432/app?search_path=other",
		"postgres://app:pw-4711@db:5432/app?",
	} {
		require.NoError(t, CheckURL(base), base)
		cfg, err := pgx.ParseConfig(withSearchPath(base, "t_1"))
		require.NoError(t, err, base)
		require.Equal(t, "t_1", cfg.RuntimeParams["search_path"], base)
	}
	err := CheckURL("postgres://app:pw-4711@db:5432,db-2:x/app")
	require.ErrorContains(t, err, "invalid port")
	require.NotContains(t, err.Error(), "pw-4711")
	require.Error(t, CheckURL("host=db dbname=app"))
}
