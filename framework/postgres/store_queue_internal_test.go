package postgres

import (
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestQueueArgs shows that a queued statement runs with a copy of its
// arguments that the caller's later changes do not reach: its bytes are
// copied, a named argument is its value (as database/sql hands it to
// pgx), and an argument that a copy might not hold keeps the statement
// out of the queue.
func TestQueueArgs(t *testing.T) {
	var s Store
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	body, raw := []byte("body"), json.RawMessage(`{"a":1}`)
	args := []any{body, raw, sql.Named("n", "named"), at, sql.NullInt64{Int64: 7, Valid: true}}
	queued, ok := s.QueueArgs(args)
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
		_, ok := s.QueueArgs([]any{arg})
		require.False(t, ok, "%T", arg)
	}
	_, ok = s.QueueArgs(nil)
	require.False(t, ok, "without arguments pgx sends the simple protocol, which runs several statements")
}
