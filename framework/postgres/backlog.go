package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

var _ driver.BacklogCounter = (*Transport)(nil)

// Backlogs returns what waits for consumer in each of its partitions
// (driver.BacklogCounter), on the database handed to New: in each topic
// of types and in the consumer's replay topic, the rows after the
// partition's acknowledged position, in its row of the topic's offsets
// table (the group "<consumer>#<p>/<n>", or the consumer's own group when
// it is not partitioned). The rows handed out and not yet acknowledged
// in order count as waiting. The age of the oldest is that of the first
// row after the position, by the server's clock (now() less its
// created_at).
//
// Each topic costs one statement of two queries: a look at the catalog
// for its tables, then, per partition, a count of at most
// driver.BacklogCap+1 entries of an index: the partitions' index of n
// (which the consumer's subscribers build, see TransportConfig), or the
// primary key when the consumer is not partitioned. A topic whose tables
// or partitions' rows do not exist yet has nothing waiting.
func (t *Transport) Backlogs(ctx context.Context, consumer string, types []string, partitions int) ([]driver.PartitionBacklog, error) {
	if consumer == "" {
		return nil, fmt.Errorf("postgres: backlogs: empty consumer name")
	}
	if partitions > driver.MaxPartitions {
		return nil, fmt.Errorf("postgres: backlogs of %s: partitions: at most %d, got %d", consumer, driver.MaxPartitions, partitions)
	}
	n := max(partitions, 1)
	out := make([]driver.PartitionBacklog, n)
	for p := range out {
		out[p].Partition, out[p].OldestKnown = p, true
	}
	topics := slices.Clone(types)
	slices.Sort(topics)
	topics = append(slices.Compact(topics), pipeline.ReplayTopic(consumer))
	db := t.pub.buckets.db
	for _, topic := range topics {
		counts, err := topicBacklogs(ctx, db, t.cfg.TablePrefix, consumer, topic, n)
		if err != nil {
			return nil, fmt.Errorf("postgres: backlogs of %s in %s: %w", consumer, topic, err)
		}
		for p, c := range counts {
			b := &out[p]
			b.Topics = append(b.Topics, c)
			b.Waiting += c.Waiting
			b.More = b.More || c.More
			b.Oldest = max(b.Oldest, c.Oldest)
		}
	}
	for p := range out {
		if out[p].Waiting > driver.BacklogCap {
			out[p].Waiting, out[p].More = driver.BacklogCap, true
		}
	}
	return out, nil
}

// topicBacklogs returns the backlog in topic of each of consumer's n
// partitions (one when n is 1), by partition.
func topicBacklogs(ctx context.Context, db *sqlx.DB, prefix, consumer, topic string, n int) ([]driver.TopicBacklog, error) {
	out := make([]driver.TopicBacklog, n)
	for p := range out {
		out[p].Topic = topic
	}
	messages, offsets := MessagesTable(prefix, topic), OffsetsTable(prefix, topic)
	var tables, bucket bool
	err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $3 AND NOT attisdropped)
			AND to_regprocedure($4) IS NOT NULL`,
		messages, offsets, bucketColumn, bucketFunction+"(text)").Scan(&tables, &bucket)
	if err != nil {
		return nil, fmt.Errorf("tables: %w", err)
	}
	if !tables || n > 1 && !bucket { // no partition's row can exist yet
		return out, nil
	}
	parts := make([]int32, n)
	groups := make([]string, n)
	for p := range n {
		parts[p], groups[p] = int32(p), consumer
		if n > 1 {
			groups[p] = partitionGroup(consumer, p, n)
		}
	}
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("count: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // read only: nothing to commit
	if _, err := tx.ExecContext(ctx, countSettings); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	rows, err := tx.QueryContext(ctx, backlogQuery(messages, offsets, n), parts, groups, driver.BacklogCap+1)
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var (
			p       int
			known   bool
			pos     int64
			waiting int64
			oldest  int64 // microseconds
		)
		if err := rows.Scan(&p, &known, &pos, &waiting, &oldest); err != nil {
			return nil, fmt.Errorf("count: %w", err)
		}
		if p < 0 || p >= n {
			return nil, fmt.Errorf("count: partition %d of %d", p, n)
		}
		out[p].Known, out[p].Position = known, pos
		out[p].Waiting, out[p].More = min(waiting, driver.BacklogCap), waiting > driver.BacklogCap
		out[p].Oldest = max(time.Duration(oldest)*time.Microsecond, 0)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	return out, nil
}

// countSettings make the planner walk an index to count a backlog, and
// stop at the limit, for the transaction: it would rather collect every
// entry after the position in a bitmap first (a cost that grows with the
// backlog, past the cap), or read the table from its start.
const countSettings = `SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off`

// backlogQuery counts, for each partition ($1) and its group ($2), the
// rows of messages after the group's acknowledged position in offsets, at
// most $3 of them: through the partitions' index of n (its expression
// named as bucketIndexSQL names it), or the primary key when n is 1. A
// partition whose group has no row counts none. The last column is the
// age of the first row after the position in microseconds, by the
// server's clock; 0 when none. Run it with
// countSettings.
func backlogQuery(messages, offsets string, n int) string {
	var inPartition string
	if n > 1 {
		inPartition = `(` + bucketExpr + ` % ` + strconv.Itoa(n) + `) = p.part AND `
	}
	return `SELECT p.part, o.consumer_group IS NOT NULL, COALESCE(o.offset_acked, 0),
		CASE WHEN o.consumer_group IS NULL THEN 0 ELSE (
			SELECT count(*) FROM (
				SELECT 1 FROM ` + messages + ` AS m
				WHERE ` + inPartition + `(m.transaction_id, m."offset") >
					(COALESCE(o.last_processed_transaction_id, '0'::xid8), COALESCE(o.offset_acked, 0))
				LIMIT $3
			) AS w
		) END,
		CASE WHEN o.consumer_group IS NULL THEN 0 ELSE COALESCE((
			SELECT ` + ageOf("m.created_at") + `
			FROM ` + messages + ` AS m
			WHERE ` + inPartition + `(m.transaction_id, m."offset") >
				(COALESCE(o.last_processed_transaction_id, '0'::xid8), COALESCE(o.offset_acked, 0))
			ORDER BY m.transaction_id, m."offset"
			LIMIT 1
		), 0) END
		FROM unnest($1::int[], $2::text[]) AS p(part, grp)
		LEFT JOIN ` + offsets + ` AS o ON o.consumer_group = p.grp
		ORDER BY p.part`
}
