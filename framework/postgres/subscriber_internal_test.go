package postgres

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestReadStartsAtPosition shows that a read looks at the rows after the
// subscription's position only, through the messages table's primary key,
// however many rows lie before it: watermill-sql's condition, an OR of
// two comparisons, made PostgreSQL walk the index from its start and
// filter out every row already read, so that each read of a backlog cost
// more than the one before.
func TestReadStartsAtPosition(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db, err := Open(context.Background(), url, OpenConfig{MaxOpenConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "explain", "explain"
	s, err := newSubscriber(db, group, 1, TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.SubscribeInitialize(topic))
	messages := MessagesTable("", topic)
	for range 4 { // a backlog written by several transactions
		_, err := db.ExecContext(ctx, `INSERT INTO `+messages+` (uuid, payload, metadata, transaction_id)
			SELECT 'u' || g, '{}', '{}', pg_current_xact_id() FROM generate_series(1, 500) AS g`)
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `ANALYZE `+messages)
	require.NoError(t, err)
	var (
		xid    string
		offset int64
	)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT transaction_id::text, "offset" FROM `+messages+
		` ORDER BY transaction_id, "offset" OFFSET 1500 LIMIT 1`).Scan(&xid, &offset))

	for _, marking := range []bool{false, true} {
		t.Run("marking="+strconv.FormatBool(marking), func(t *testing.T) {
			q := newSubscriptionQueries(s.cfg, topic, marking)
			args := []any{xid, offset, 10}
			if marking {
				args = append(args, group, int64(0), "0")
			}
			explain := func() (planNode, []byte) {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }() // EXPLAIN ANALYZE runs the handed-out write too
				var plan []byte
				require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.read, args...).Scan(&plan))
				var nodes []struct{ Plan planNode }
				require.NoError(t, json.Unmarshal(plan, &nodes))
				scan, ok := nodes[0].Plan.find(func(n planNode) bool { return n.Relation == messages[1:len(messages)-1] })
				require.True(t, ok, "the plan reads the messages table: %s", plan)
				return scan, plan
			}
			scan, plan := explain()
			for scan.ActualRows < 10 && ctx.Err() == nil { // a transaction open elsewhere hides the rows for a while
				scan, plan = explain()
			}
			require.Equal(t, "Index Scan", scan.Type, "%s", plan)
			require.Zero(t, scan.RemovedByFilter, "rows before the position were looked at: %s", plan)
			require.Equal(t, 10.0, scan.ActualRows, "%s", plan)
		})
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	ActualRows      float64    `json:"Actual Rows"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	Plans           []planNode `json:"Plans"`
}

// find returns the first node of n's tree, depth first, that match
// accepts.
func (n planNode) find(match func(planNode) bool) (planNode, bool) {
	if match(n) {
		return n, true
	}
	for _, c := range n.Plans {
		if found, ok := c.find(match); ok {
			return found, true
		}
	}
	return planNode{}, false
}

// TestReadWritesPositions shows that a read writes, in its own statement,
// the group's handed-out position (its last row) and the acknowledged
// position it is given, so that no other statement is needed for them
// while a backlog drains; neither ever moves back.
func TestReadWritesPositions(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db, err := Open(context.Background(), url, OpenConfig{MaxOpenConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "positions", "positions"
	s, err := newSubscriber(db, group, 1, TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.SubscribeInitialize(topic))
	messages, offsets := MessagesTable("", topic), OffsetsTable("", topic)
	_, err = db.ExecContext(ctx, `INSERT INTO `+messages+` (uuid, payload, metadata, transaction_id)
		SELECT 'u' || g, '{}', '{}', pg_current_xact_id() FROM generate_series(1, 6) AS g`)
	require.NoError(t, err)
	q := newSubscriptionQueries(s.cfg, topic, true)
	type positions struct{ acked, handedOut int64 }
	// read reads until it gets want rows: a transaction open elsewhere on
	// the server (another test's) may hide them for a while.
	read := func(after, acked int64, xid string, want int) (rows int, got positions) {
		t.Helper()
		from := xid
		if after == 0 {
			from = "0"
		}
		for rows = -1; rows != want && ctx.Err() == nil; {
			res, err := db.QueryContext(ctx, q.read, from, after, 4, group, acked, xid)
			require.NoError(t, err)
			for rows = 0; res.Next(); rows++ {
			}
			require.NoError(t, res.Err())
			require.NoError(t, res.Close())
		}
		require.NoError(t, db.QueryRowContext(ctx, `SELECT offset_acked, handed_out_offset FROM `+offsets+
			` WHERE consumer_group = $1`, group).Scan(&got.acked, &got.handedOut))
		return rows, got
	}
	var xid string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT max(transaction_id)::text FROM `+messages).Scan(&xid))

	rows, got := read(0, 0, xid, 4)
	require.Equal(t, 4, rows)
	require.Equal(t, positions{acked: 0, handedOut: 4}, got, "the last row read is handed out")
	rows, got = read(4, 2, xid, 2)
	require.Equal(t, 2, rows)
	require.Equal(t, positions{acked: 2, handedOut: 6}, got, "the acknowledged position comes with the read")
	rows, got = read(6, 1, xid, 0)
	require.Zero(t, rows)
	require.Equal(t, positions{acked: 2, handedOut: 6}, got, "neither moves back")
}
