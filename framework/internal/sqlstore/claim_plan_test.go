package sqlstore_test

import (
	"context"
	"encoding/json"
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
	rows, held, err := o.Claim(ctx, tx, limit, 1<<20)
	require.NoError(t, err)
	require.Len(t, rows, limit)
	require.False(t, held)

	// The same claim again in the claim's transaction, whose rows it
	// locks already (a transaction does not skip its own locks).
	statement, args := sqlstore.ClaimStatement(limit, 1<<20)
	var out []byte
	require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+statement, args...).Scan(&out))
	var plans []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal(out, &plans))
	scans := plans[0].Plan.scansOf("outbox")
	require.NotEmpty(t, scans, "%s", out)
	for _, s := range scans {
		require.LessOrEqual(t, s.ActualRows, float64(limit), "a claim of %d read more rows: %s", limit, out)
	}
}

// TestClaimReplaysReadsOnlyItsBatchWithoutStatistics: the claim of
// replays on PostgreSQL, after qIndexScansOnly in its transaction as
// ClaimReplays runs it, reads no more replays than it leases in a table
// never analyzed, as one a bulk replay just filled. Without it, a claim
// of 100 read and sorted all 20,000.
func TestClaimReplaysReadsOnlyItsBatchWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	_, err := db.ExecContext(ctx, `INSERT INTO replays (consumer, body, created_at)
SELECT 'test', convert_to(repeat('x', 300), 'UTF8'), now() FROM generate_series(1, 20000)`)
	require.NoError(t, err)

	const limit = 100
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }() // EXPLAIN ANALYZE leases them
	require.NoError(t, sqlstore.IndexScansOnly(ctx, tx))
	now := time.Now()
	statement, args := sqlstore.ClaimReplaysStatement(now, limit, now.Add(time.Minute))
	var out []byte
	require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+statement, args...).Scan(&out))
	var plans []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal(out, &plans))
	scans := plans[0].Plan.scansOf("replays")
	require.NotEmpty(t, scans, "%s", out)
	for _, s := range scans {
		require.LessOrEqual(t, s.ActualRows, float64(limit), "a claim of %d read more replays: %s", limit, out)
	}
}
