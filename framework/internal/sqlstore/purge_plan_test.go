package sqlstore_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// TestPurgesBySentAtReadOnlyOldRows: the outbox's cleanup and the purge of
// sent replays find the rows sent before their time through an index on
// sent_at, and read no other row. With 2,000 rows sent a minute ago and a
// purge of those sent an hour ago, nothing is read: ordered by id, the
// cleanup walked every sent row kept (a day's, by default) each time it
// found little or nothing to delete.
func TestPurgesBySentAtReadOnlyOldRows(t *testing.T) {
	eachDatabase(t, func(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect) {
		now := time.Now()
		fillSent(ctx, t, db, d, 2000, now.Add(-time.Minute))

		statements, args := sqlstore.PurgesBySentAt(d, now.Add(-time.Hour), 1000)
		for table, statement := range statements {
			if d == sqlstore.SQLite {
				requireSQLiteSearch(ctx, t, db, table, statement, args)
			} else {
				requirePostgresReadsNone(ctx, t, db, table, statement, args)
			}
		}
	})
}

// fillSent adds n rows sent at sent to the outbox and to the replays.
func fillSent(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect, n int, sent time.Time) {
	t.Helper()
	at := sqlstore.TimeArg(d, sent)
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	outbox := tx.Rebind(`INSERT INTO outbox (event_id, source, type, body, created_at, sent_at) VALUES (?, 'test', 'test.sent', ?, ?, ?)`)
	replay := tx.Rebind(`INSERT INTO replays (dead_letter_id, consumer, body, created_at, sent_at) VALUES (?, 'test', ?, ?, ?)`)
	for i := range n {
		_, err := tx.ExecContext(ctx, outbox, "e-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), []byte(`{}`), at, at)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, replay, i+1, []byte(`{}`), at, at)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	if d == sqlstore.Postgres {
		_, err = db.ExecContext(ctx, `ANALYZE outbox; ANALYZE replays`)
		require.NoError(t, err)
	}
}

// requireSQLiteSearch requires SQLite's plan of statement to search table
// by a range of sent_at, and to scan no table.
func requireSQLiteSearch(ctx context.Context, t *testing.T, db *sqlx.DB, table, statement string, args []any) {
	t.Helper()
	rows, err := db.QueryxContext(ctx, `EXPLAIN QUERY PLAN `+statement, args...)
	require.NoError(t, err)
	defer rows.Close()
	var details []string
	for rows.Next() {
		var (
			id, parent, unused int
			detail             string
		)
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		details = append(details, detail)
	}
	require.NoError(t, rows.Err())
	plan := strings.Join(details, "\n")
	search := regexp.MustCompile(`SEARCH ` + table + ` USING (COVERING )?INDEX ` + table + `_sent\w* \((sent_at>\? AND )?sent_at<\?\)`)
	require.Regexp(t, search, plan, "%s", table)
	require.NotContains(t, plan, "SCAN ", "%s: %s", table, plan)
}

// requirePostgresReadsNone requires PostgreSQL, running statement (rolled
// back), to read no row of table: none is old enough.
func requirePostgresReadsNone(ctx context.Context, t *testing.T, db *sqlx.DB, table, statement string, args []any) {
	t.Helper()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }() // EXPLAIN ANALYZE runs the delete
	scans, out := explainScans(ctx, t, tx, table, statement, args)
	for _, s := range scans {
		require.NotEqual(t, "Seq Scan", s.Type, "%s: %s", table, out)
		require.Zero(t, s.RemovedByFilter, "%s: rows sent within the hour were read: %s", table, out)
		require.Zero(t, s.ActualRows, "%s: %s", table, out)
	}
}

// explainScans runs statement with args under EXPLAIN (ANALYZE, FORMAT
// JSON) in q, and returns the nodes of its plan that read table, at
// least one, and the plan.
func explainScans(ctx context.Context, t *testing.T, q sqlx.QueryerContext, table, statement string, args []any) ([]planNode, []byte) {
	t.Helper()
	var out []byte
	require.NoError(t, q.QueryRowxContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+statement, args...).Scan(&out))
	var plans []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal(out, &plans))
	scans := plans[0].Plan.scansOf(table)
	require.NotEmpty(t, scans, "%s: %s", table, out)
	return scans, out
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	ActualRows      float64    `json:"Actual Rows"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	Plans           []planNode `json:"Plans"`
}

// scansOf returns the nodes of n's tree that read table.
func (n planNode) scansOf(table string) []planNode {
	var out []planNode
	if n.Relation == table && n.Type != "Delete" && n.Type != "ModifyTable" {
		out = append(out, n)
	}
	for _, c := range n.Plans {
		out = append(out, c.scansOf(table)...)
	}
	return out
}
