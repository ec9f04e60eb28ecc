package postgres_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestExecQueued runs queued statements in one round trip in a
// connection's transaction, each with its own count of rows, and none on
// a connection without an open transaction (one that database/sql rolled
// back when its context ended), where each would commit alone.
func TestExecQueued(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.Postgres(t)
	_, err := db.Exec(`CREATE TABLE effects (id text PRIMARY KEY)`)
	require.NoError(t, err)
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	insert := []string{`INSERT INTO effects (id) VALUES ($1)`, `DELETE FROM effects WHERE id <> $1`}

	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, failed, err := store.ExecQueued(ctx, conn, insert[:1], [][]any{{"outside"}})
	require.ErrorContains(t, err, "no open transaction")
	require.Equal(t, -1, failed)

	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	rows, failed, err := store.ExecQueued(ctx, conn, []string{insert[0], insert[0], insert[1]}, [][]any{{"a"}, {"b"}, {"b"}})
	require.NoError(t, err)
	require.Equal(t, -1, failed)
	require.Equal(t, []int64{1, 1, 1}, rows, "two inserts, then a deletes one row")
	_, failed, err = store.ExecQueued(ctx, conn, []string{insert[0], insert[0]}, [][]any{{"c"}, {"b"}})
	require.ErrorContains(t, err, "23505")
	require.Equal(t, 1, failed, "the second statement failed")
	require.NoError(t, tx.Rollback())

	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM effects`))
	require.Zero(t, n, "nothing ran outside the transaction, and it rolled back")
}
