package postgres

import (
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestQueueable shows which statements of a batch's attempts wait to run
// with their batch-mates': writes with arguments, whatever blanks and
// comments come first, and nothing else.
func TestQueueable(t *testing.T) {
	var s Store
	for query, want := range map[string]bool{
		`INSERT INTO t VALUES ($1)`:                          true,
		"  \n\tupdate t SET a = $1":                          true,
		`-- a comment` + "\n" + `DELETE FROM t WHERE a = $1`: true,
		`/* a /* nested */ comment */ MERGE INTO t USING s ON true WHEN MATCHED THEN DO NOTHING`: true,
		`SELECT pg_advisory_xact_lock($1)`:                    false,
		`WITH x AS (SELECT $1) INSERT INTO t SELECT * FROM x`: false,
		`/* unterminated INSERT`:                              false,
		`-- only a comment, INSERT`:                           false,
		`INSERTED`:                                            false,
		``:                                                    false,
	} {
		_, ok := s.Queueable(query, []any{1})
		require.Equal(t, want, ok, "%q", query)
	}
	_, ok := s.Queueable(`INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)`, nil)
	require.False(t, ok, "without arguments pgx sends the simple protocol, which runs several statements")
}

// TestQueueableArgs shows that a queued statement runs with a copy of its
// arguments that the caller's later changes do not reach: its bytes are
// copied, a named argument is its value (as database/sql hands it to
// pgx), and an argument that a copy might not hold keeps the statement
// out of the queue.
func TestQueueableArgs(t *testing.T) {
	var s Store
	const insert = `INSERT INTO t VALUES ($1, $2, $3, $4, $5)`
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	body, raw := []byte("body"), json.RawMessage(`{"a":1}`)
	args := []any{body, raw, sql.Named("n", "named"), at, sql.NullInt64{Int64: 7, Valid: true}}
	queued, ok := s.Queueable(insert, args)
	require.True(t, ok)
	body[0], raw[2] = 'X', 'X'
	args[3] = "changed"
	require.Equal(t, []any{[]byte("body"), json.RawMessage(`{"a":1}`), "named", at, sql.NullInt64{Int64: 7, Valid: true}}, queued)

	n := 1
	for _, arg := range []any{
		&n,
		[]string{"a"},
		map[string]any{"a": 1},
		struct{ A int }{1},
		pgx.QueryExecModeSimpleProtocol,
		pgx.NamedArgs{"a": 1},
		sql.Named("p", &n),
	} {
		_, ok := s.Queueable(`INSERT INTO t VALUES ($1)`, []any{arg})
		require.False(t, ok, "%T", arg)
	}
}
