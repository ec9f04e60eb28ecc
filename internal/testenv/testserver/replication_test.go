package testserver_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestPairFailover: a row committed on a synchronous primary is on the
// standby once promoted, and the pair's URL, which names both, reaches
// the new primary and writes there.
func TestPairFailover(t *testing.T) {
	t.Parallel()
	p := testserver.StartPair(t, true)
	db, err := sql.Open("pgx", p.URL("postgres"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE t (n int)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO t VALUES (1)`)
	require.NoError(t, err)

	p.Primary.Kill(t)
	p.Standby.Promote(t)
	_, err = db.Exec(`INSERT INTO t VALUES (2)`)
	require.NoError(t, err, "the URL reaches the new primary")
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 2, n, "the row committed before the failover is there")
}
