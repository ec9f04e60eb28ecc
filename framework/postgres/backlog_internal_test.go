package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestBacklogCountUsesIndex shows that the backlog of a partitioned
// consumer is counted through the partitions' index, from each
// partition's position: an index range scan per partition that looks at
// no row of another partition nor before the position, and one more that
// stops at the first row after it for the oldest's age; and that its
// counts are those of a plain count.
func TestBacklogCountUsesIndex(t *testing.T) {
	t.Parallel()
	db, err := Open(context.Background(), testenv.PostgresURL(t), OpenConfig{MaxOpenConns: 3})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, n = "explain.backlog", "explain", 4
	s, err := newSubscriber(db, group, 1, TransportConfig{})
	require.NoError(t, err)
	s.partitions = n
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.SubscribeInitialize(topic))
	messages, offsets := MessagesTable("", topic), OffsetsTable("", topic)
	for i := range 4 { // half the rows by hand, without their bucket
		bucket := "(g % 1024)::smallint"
		if i%2 == 1 {
			bucket = "NULL"
		}
		_, err := db.ExecContext(ctx, `INSERT INTO `+messages+` (uuid, payload, metadata, transaction_id, bucket)
			SELECT 'u' || g, json_build_object('subject', 's' || g), '{}', pg_current_xact_id(), `+bucket+` FROM generate_series(1, 2000) AS g`)
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `ANALYZE `+messages)
	require.NoError(t, err)
	// Every partition acknowledged up to the 6000th row.
	_, err = db.ExecContext(ctx, `UPDATE `+offsets+` AS o SET last_processed_transaction_id = r.transaction_id, offset_acked = r."offset"
		FROM (SELECT transaction_id, "offset" FROM `+messages+` ORDER BY transaction_id, "offset" OFFSET 5999 LIMIT 1) AS r
		WHERE o.consumer_group LIKE 'explain#%'`)
	require.NoError(t, err)

	counts, err := topicBacklogs(ctx, db, "", group, topic, n)
	require.NoError(t, err)
	var total int64
	for p, c := range counts {
		var want int64
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM `+messages+` AS m, `+offsets+` AS o
			WHERE o.consumer_group = $1 AND (`+bucketExpr+` % 4) = $2
			AND (m.transaction_id, m."offset") > (o.last_processed_transaction_id, o.offset_acked)`,
			partitionGroup(group, p, n), p).Scan(&want))
		require.Equal(t, want, c.Waiting, "partition %d", p)
		require.True(t, c.Known)
		require.Positive(t, c.Position)
		require.Positive(t, c.Oldest, "the age of the first row after the position")
		total += c.Waiting
	}
	require.Equal(t, int64(2000), total, "the rows after the 6000th")

	parts := []int32{0, 1, 2, 3}
	groups := []string{partitionGroup(group, 0, n), partitionGroup(group, 1, n), partitionGroup(group, 2, n), partitionGroup(group, 3, n)}
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(ctx, countSettings)
	require.NoError(t, err)
	var plan []byte
	require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+backlogQuery(messages, offsets, n),
		parts, groups, driver.BacklogCap+1).Scan(&plan))
	var nodes []struct{ Plan indexScan }
	require.NoError(t, json.Unmarshal(plan, &nodes))
	scans := nodes[0].Plan.scans(messages[1 : len(messages)-1])
	require.Len(t, scans, 2, "the count, then the oldest's age: %s", plan)
	for _, scan := range scans {
		require.Contains(t, []string{"Index Scan", "Index Only Scan"}, scan.Type, "%s", plan)
		require.Equal(t, bucketIndex("", topic, n), scan.Index, "%s", plan)
		require.Equal(t, 4.0, scan.Loops, "a scan per partition: %s", plan)
		require.Zero(t, scan.RemovedByFilter, "rows of other partitions, or before the position, were looked at: %s", plan)
	}
	require.Equal(t, 500.0, scans[0].ActualRows, "500 rows per partition, on average: %s", plan)
	require.Equal(t, 1.0, scans[1].ActualRows, "the first row after the position, per partition: %s", plan)
}
