package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestClaimReadsOnlyItsBatchWithoutStatistics: a relay's claim on
// PostgreSQL reads no more unsent rows than it locks, also in an outbox
// that was never analyzed, as a new one filled faster than autovacuum
// looks. Without statistics the planner guessed that few rows were
// unsent, read all 50,000 with a bitmap scan and sorted them for a claim
// of 1,000: each claim cost what the whole backlog does.
func TestClaimReadsOnlyItsBatchWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	_, err := db.ExecContext(ctx, `INSERT INTO outbox (event_id, source, type, body, created_at)
SELECT 'e-' || g, 'test', 'test.unsent', convert_to(repeat('x', 300), 'UTF8'), now() FROM generate_series(1, 50000) g`)
	require.NoError(t, err)
	o, err := sqlstore.NewOutbox(sqlstore.Postgres, "")
	require.NoError(t, err)

	const limit = 1000
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	rows, held, err := o.Claim(ctx, tx, limit, 1<<20, sqlstore.Skip{}, 0)
	require.NoError(t, err)
	require.Len(t, rows, limit)
	require.False(t, held)

	// The same claim again in the claim's transaction, whose rows it
	// locks already (a transaction does not skip its own locks).
	statement, args := sqlstore.ClaimStatement(limit, 1<<20)
	scans, out := explainScans(ctx, t, tx, "outbox", statement, args)
	for _, s := range scans {
		require.LessOrEqual(t, s.ActualRows, float64(limit), "a claim of %d read more rows: %s", limit, out)
	}
}

// TestClaimIdleBound: a claim on PostgreSQL sets its transaction's idle
// bound (idle_in_transaction_session_timeout) for the transaction only;
// one past the most PostgreSQL takes (about 24.8 days, from a batch
// timeout of weeks) is its most, not a failed claim.
func TestClaimIdleBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	db.SetMaxOpenConns(1) // the setting is read back on the claim's connection
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	o, err := sqlstore.NewOutbox(sqlstore.Postgres, "")
	require.NoError(t, err)
	for _, tc := range []struct {
		idle time.Duration
		want string
	}{
		{4 * time.Second, "4s"},
		{1000 * 24 * time.Hour, "2147483647ms"},
		{0, "0"}, // the server's own
	} {
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		_, _, err = o.Claim(ctx, tx, 10, 1<<20, sqlstore.Skip{}, tc.idle)
		require.NoError(t, err, "idle %s", tc.idle)
		var got string
		require.NoError(t, tx.GetContext(ctx, &got, `SHOW idle_in_transaction_session_timeout`))
		require.Equal(t, tc.want, got, "idle %s", tc.idle)
		require.NoError(t, tx.Rollback())
		require.NoError(t, db.GetContext(ctx, &got, `SHOW idle_in_transaction_session_timeout`))
		require.Equal(t, "0", got, "the bound ends with the transaction")
	}
}

// TestClaimReplaysReadsOnlyItsBatchWithoutStatistics: ClaimReplays on
// PostgreSQL reads no more entries of the index on unsent replays than it
// leases, also in a table never analyzed, as one a bulk replay just
// filled. Without statistics a claim of 100 read all 20,000 with a bitmap
// scan and sorted them. What the claim read is the index's idx_tup_read
// in pg_stat_user_indexes, flushed by its connection, the pool's only one.
func TestClaimReplaysReadsOnlyItsBatchWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	db.SetMaxOpenConns(1)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	_, err := db.ExecContext(ctx, `INSERT INTO replays (consumer, body, created_at)
SELECT 'test', convert_to(repeat('x', 300), 'UTF8'), now() FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	store, err := sqlstore.New(db, sqlstore.Postgres, sqlstore.Options{})
	require.NoError(t, err)

	read := func() int64 {
		t.Helper()
		_, err := db.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		var n int64
		require.NoError(t, db.GetContext(ctx, &n, `SELECT idx_tup_read FROM pg_stat_user_indexes
WHERE schemaname = current_schema() AND indexrelname = 'replays_unsent_idx'`))
		return n
	}
	const limit = 100
	before := read()
	claimed, err := store.ClaimReplays(ctx, limit, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, limit)
	require.LessOrEqual(t, read()-before, int64(2*limit), "a claim of %d read more of the unsent replays' index", limit)
}
