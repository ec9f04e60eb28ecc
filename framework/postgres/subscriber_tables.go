package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jmoiron/sqlx"
)

// handedOutColumns are the columns the subscriber adds to watermill-sql's
// offsets table: the position of the last message handed out, NULL in a
// group's row written before they existed (unknown) and 0 in a new
// group's (nothing handed out).
var handedOutColumns = [2]string{"handed_out_transaction_id", "handed_out_offset"}

// SubscribeInitialize creates topic's tables when they are missing, as
// watermill-sql does, and the group's row in the offsets table, so that
// the group keeps every message published from now on. It adds the
// handed-out columns to the offsets table and the trigger that wakes the
// subscriptions to the messages table, also to tables that exist
// already.
func (s *subscriber) SubscribeInitialize(topic string) error {
	if topic == "" {
		return errors.New("postgres: subscribe: empty topic")
	}
	ctx, cancel := context.WithTimeout(s.base, time.Minute)
	defer cancel()
	return s.initialize(ctx, topic)
}

// initialize creates topic's tables, the handed-out columns and the
// group's rows (one per partition when partitioned), then the notify
// trigger; when partitioned, also the bucket column and function, and the
// index of the consumer's partitions. Columns that cannot be added (no
// rights on the table) are logged once per topic, and the deliveries say
// nothing of redelivery; a partitioned subscriber needs them, and fails. A
// trigger or an index that cannot be created is logged once per topic:
// the subscriptions poll, or read without the index.
func (s *subscriber) initialize(ctx context.Context, topic string) error {
	if err := initializeTables(ctx, s.db, s.cfg, topic, true); err != nil {
		return err
	}
	if err := s.ensureHandedOut(ctx, topic); err != nil {
		if s.partitioned() || s.base.Err() != nil || ctx.Err() != nil {
			return fmt.Errorf("initialize %s: %w", topic, err)
		}
		s.mu.Lock()
		warned := s.noMarks[topic]
		s.noMarks[topic] = true
		s.mu.Unlock()
		if !warned {
			s.log.Warn("postgres subscriber: could not add the handed-out columns to the offsets table; every delivery is counted",
				slog.String("topic", topic), slog.Any("error", err))
		}
	}
	if s.partitioned() {
		if err := s.initializePartitions(ctx, topic); err != nil {
			return err
		}
	}
	if err := s.initializeRows(ctx, topic); err != nil {
		return fmt.Errorf("initialize %s: group: %w", topic, err)
	}
	err := s.ensureTrigger(ctx, topic)
	if err == nil || s.base.Err() != nil || ctx.Err() != nil {
		return nil
	}
	s.mu.Lock()
	warned := s.noTrigger[topic]
	s.noTrigger[topic] = true
	s.mu.Unlock()
	if !warned {
		s.log.Warn("postgres subscriber: could not create the notify trigger; idle subscriptions poll every PollInterval",
			slog.String("topic", topic), slog.Any("error", err), slog.Duration("poll_interval", s.cfg.PollInterval))
	}
	return nil
}

// ensureHandedOut adds the handedOutColumns to topic's offsets table,
// unless it has them, in a transaction of its own under an advisory lock.
// The rows there get NULL (unknown), new rows 0. A failure leaves the
// table as it was.
func (s *subscriber) ensureHandedOut(ctx context.Context, topic string) error {
	table := OffsetsTable(s.cfg.TablePrefix, topic)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("handed-out columns of %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('`+handedOutLock+`', 0))`); err != nil {
		return fmt.Errorf("handed-out columns of %s: lock: %w", topic, err)
	}
	var n int
	err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = $1::text::regclass AND attname IN ($2, $3) AND NOT attisdropped`,
		table, handedOutColumns[0], handedOutColumns[1]).Scan(&n)
	if err != nil {
		return fmt.Errorf("handed-out columns of %s: %w", topic, err)
	}
	if n == len(handedOutColumns) {
		return nil
	}
	xid, off := handedOutColumns[0], handedOutColumns[1]
	for _, q := range []string{
		`SET LOCAL lock_timeout = ` + strconv.FormatInt(triggerLockTimeout.Milliseconds(), 10),
		`ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS ` + xid + ` xid8, ADD COLUMN IF NOT EXISTS ` + off + ` bigint`,
		`ALTER TABLE ` + table + ` ALTER COLUMN ` + xid + ` SET DEFAULT '0', ALTER COLUMN ` + off + ` SET DEFAULT 0`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("handed-out columns of %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("handed-out columns of %s: commit: %w", topic, err)
	}
	return nil
}

// ensureTrigger adds to topic's messages table, unless it has it, the
// trigger that notifies notifyChannel after each INSERT statement with the
// inserting transaction's id, in a transaction of its own. A transaction
// advisory lock keeps processes that subscribe at once from creating it
// twice.
func (s *subscriber) ensureTrigger(ctx context.Context, topic string) error {
	table := MessagesTable(s.cfg.TablePrefix, topic)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("notify trigger of %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('`+notifyTrigger+`', 0))`); err != nil {
		return fmt.Errorf("notify trigger of %s: lock: %w", topic, err)
	}
	var exists bool
	err = tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::text::regclass AND tgname = $2)`,
		table, notifyTrigger).Scan(&exists)
	if err != nil {
		return fmt.Errorf("notify trigger of %s: %w", topic, err)
	}
	if exists {
		return nil
	}
	for _, q := range []string{
		`SET LOCAL lock_timeout = ` + strconv.FormatInt(triggerLockTimeout.Milliseconds(), 10),
		`CREATE OR REPLACE FUNCTION ` + notifyTrigger + `() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				PERFORM pg_notify(TG_ARGV[0], pg_current_xact_id()::text);
				RETURN NULL;
			END $$`,
		`CREATE TRIGGER ` + notifyTrigger + ` AFTER INSERT ON ` + table + ` FOR EACH STATEMENT
			EXECUTE FUNCTION ` + notifyTrigger + `(` + quoteLiteral(notifyChannel(s.cfg.TablePrefix, topic)) + `)`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("notify trigger of %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("notify trigger of %s: commit: %w", topic, err)
	}
	return nil
}

// notifyChannel returns the channel that topic's trigger notifies: the
// messages table's name (MessagesTable's, unquoted) after "notify_", cut
// to PostgreSQL's 63 bytes as table names are.
func notifyChannel(prefix, topic string) string {
	return identifier("notify_" + identifier(prefix+"watermill_"+topic))
}

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// initializeTables runs watermill-sql's schema queries of topic's
// messages table and, with offsets, of its offsets table, in one
// transaction.
func initializeTables(ctx context.Context, db *sqlx.DB, cfg TransportConfig, topic string, offsets bool) error {
	queries, err := schemaAdapter(cfg).SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	if offsets {
		more, err := offsetsAdapter(cfg).SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: topic})
		if err != nil {
			return fmt.Errorf("initialize %s: %w", topic, err)
		}
		queries = append(queries, more...)
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("initialize %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	for _, q := range queries {
		if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("initialize %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("initialize %s: commit: %w", topic, err)
	}
	return nil
}
