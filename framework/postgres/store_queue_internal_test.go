package postgres

import (
	"database/sql"
	"testing"

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
		require.Equal(t, want, s.Queueable(query, []any{1}), "%q", query)
	}
	require.False(t, s.Queueable(`INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)`, nil),
		"without arguments pgx sends the simple protocol, which runs several statements")
	require.False(t, s.Queueable(`INSERT INTO t VALUES ($1)`, []any{pgx.QueryExecModeSimpleProtocol, 1}),
		"a batch takes no QueryExecMode")
}

// TestPlainArgs shows that named arguments reach pgx's pipeline as their
// values, as database/sql hands them to pgx, without changing the
// caller's slice.
func TestPlainArgs(t *testing.T) {
	args := []any{1, sql.Named("b", "two")}
	require.Equal(t, []any{1, "two"}, plainArgs(args))
	require.Equal(t, sql.Named("b", "two"), args[1])
	plain := []any{1, "two"}
	require.Same(t, &plain[0], &plainArgs(plain)[0], "nothing named, nothing copied")
}
