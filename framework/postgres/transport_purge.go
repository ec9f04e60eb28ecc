package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// The purge of the transport's messages tables (driver.TopicPurger): a
// row goes once every consumer group of its topic has passed it and it is
// older than the retention.
//
// Passed: the group's acknowledged position (last_processed_transaction_id,
// offset_acked), which watermill-sql and this package's subscriber read
// after, is at or after the row's (transaction_id, "offset"). Every row of
// the offsets table counts, each partition's row of a partitioned group
// too, so the horizon is the lowest of them: a row at or before it is
// behind every group's and every partition's position, whatever its
// partition. A group that has not read yet is at ('0', 0) and pins every
// row; a topic whose offsets table has no row keeps every row, as the
// SQLite transport does.
//
// Older: created_at is watermill-sql's "timestamp without time zone"
// defaulting to CURRENT_TIMESTAMP, the inserting transaction's start
// written in its session's TimeZone. It is compared in SQL with the
// server's clock converted the same way in the purge's session,
// created_at < (now() - retention)::timestamp, never with a Go time: the
// two clocks differ, and a timestamp without zone read into Go is taken
// as UTC. A session of another TimeZone wrote its rows shifted by the
// difference (see docs/operations.md).
//
// Each batch is one statement: it reads the horizon and deletes up to
// limit rows at or before it through the primary key (transaction_id,
// "offset"), in that order, so one batch holds its locks briefly.

var _ driver.TopicPurger = (*Transport)(nil)

// purgeTopicQuery returns the batch that deletes topic's rows ($1 the
// retention in microseconds, $2 the limit); with count, the statement
// that counts them all instead.
func purgeTopicQuery(cfg TransportConfig, topic string, count bool) string {
	messages, offsets := MessagesTable(cfg.TablePrefix, topic), OffsetsTable(cfg.TablePrefix, topic)
	horizon := `WITH horizon AS (
			SELECT last_processed_transaction_id AS xid, COALESCE(offset_acked, 0) AS off
			FROM ` + offsets + ` ORDER BY 1, 2 LIMIT 1
		)`
	passed := ` FROM ` + messages + ` AS m, horizon AS h
		WHERE (m.transaction_id, m."offset") <= (h.xid, h.off)
		AND m.created_at < (now() - $1::bigint * interval '1 microsecond')::timestamp`
	if count {
		return horizon + ` SELECT count(*)` + passed
	}
	return horizon + `, doomed AS (
			SELECT m.transaction_id, m."offset"` + passed + `
			ORDER BY m.transaction_id, m."offset" LIMIT $2
		)
		DELETE FROM ` + messages + ` AS m USING doomed AS d
		WHERE m.transaction_id = d.transaction_id AND m."offset" = d."offset"`
}

// PurgeTopicBatch deletes up to limit rows of topic's messages table that
// every consumer group of the topic (each partition's row of a
// partitioned one) has passed and that were written longer than olderThan
// ago by the database's clock, and returns how many it deleted. A topic
// whose tables do not exist, or with no group, loses nothing.
func (t *Transport) PurgeTopicBatch(ctx context.Context, topic string, olderThan time.Duration, limit int) (int64, error) {
	if limit < 1 {
		return 0, fmt.Errorf("postgres: purge %s: limit must be at least 1, got %d", topic, limit)
	}
	if ok, err := t.topicTables(ctx, topic); err != nil || !ok {
		return 0, err
	}
	res, err := t.db.ExecContext(ctx, purgeTopicQuery(t.cfg, topic, false), olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("postgres: purge %s: %w", topic, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("postgres: purge %s: %w", topic, err)
	}
	return n, nil
}

// PurgeableTopic counts the rows PurgeTopicBatch would delete, deleting
// none.
func (t *Transport) PurgeableTopic(ctx context.Context, topic string, olderThan time.Duration) (int64, error) {
	if ok, err := t.topicTables(ctx, topic); err != nil || !ok {
		return 0, err
	}
	var n int64
	if err := t.db.QueryRowContext(ctx, purgeTopicQuery(t.cfg, topic, true), olderThan.Microseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("postgres: count purgeable %s: %w", topic, err)
	}
	return n, nil
}

// topicTables reports whether topic's messages and offsets tables both
// exist.
func (t *Transport) topicTables(ctx context.Context, topic string) (bool, error) {
	if t.db == nil {
		return false, errors.New("postgres: purge: the transport has no database")
	}
	var ok bool
	err := t.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
		MessagesTable(t.cfg.TablePrefix, topic), OffsetsTable(t.cfg.TablePrefix, topic)).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("postgres: purge %s: find its tables: %w", topic, err)
	}
	return ok, nil
}
