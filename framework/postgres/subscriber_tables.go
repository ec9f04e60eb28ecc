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
// group's row, then the notify trigger. Columns that cannot be added (no
// rights on the table) are logged once per topic, and the deliveries say
// nothing of redelivery; a trigger that cannot be created is logged once
// per topic, and the subscriptions poll.
func (s *subscriber) initialize(ctx context.Context, topic string) error {
	if err := s.initializeTables(ctx, topic); err != nil {
		return err
	}
	if err := s.ensureHandedOut(ctx, topic); err != nil {
		if s.base.Err() != nil || ctx.Err() != nil {
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
	if _, err := s.db.ExecContext(ctx, insertZeroOffsets(s.cfg, topic), s.group); err != nil {
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

// initializeTables runs watermill-sql's schema queries, in one
// transaction.
func (s *subscriber) initializeTables(ctx context.Context, topic string) error {
	queries, err := schemaAdapter(s.cfg).SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	offsets, err := offsetsAdapter(s.cfg).SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	queries = append(queries, offsets...)
	tx, err := s.db.BeginTxx(ctx, nil)
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

// insertZeroOffsets returns watermill-sql's query that gives a group its
// row in topic's offsets table, from the first message.
func insertZeroOffsets(cfg TransportConfig, topic string) string {
	return `INSERT INTO ` + OffsetsTable(cfg.TablePrefix, topic) +
		` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`
}

// subscriptionQueries are the statements of one topic's subscription.
type subscriptionQueries struct {
	lock, unlock, position, read, ack, zero, lower string
	listen, unlisten, newest                       string
}

// newSubscriptionQueries returns the statements of topic's subscription;
// with marking, the offsets table has the handedOutColumns: the position
// reads them, each read writes them, and lower moves them back.
func newSubscriptionQueries(cfg TransportConfig, topic string, marking bool) subscriptionQueries {
	messages, offsets := MessagesTable(cfg.TablePrefix, topic), OffsetsTable(cfg.TablePrefix, topic)
	xid, off := handedOutColumns[0], handedOutColumns[1]
	// watermill-sql's SelectQuery, from the subscription's own position
	// instead of the group's locked row, and with the position compared as
	// a row: the primary key's index then starts at the position, instead
	// of filtering every row before it (a read took milliseconds once
	// 20,000 rows were behind it).
	selectRows := `SELECT "offset", transaction_id, uuid, payload, metadata FROM ` + messages + `
			WHERE (transaction_id, "offset") > ($1::text::xid8, $2)
			AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY transaction_id, "offset" LIMIT $3`
	q := subscriptionQueries{
		// The key names the offsets table by its oid, so that the tables
		// of one name in other schemas have keys of their own.
		lock: `SELECT k, pg_try_advisory_lock(k) FROM (SELECT hashtextextended(` +
			`$1::text::regclass::oid::text || '/' || $2::text, 0) AS k) AS key`,
		unlock:   `SELECT pg_advisory_unlock($1)`,
		listen:   `LISTEN ` + quoteIdent(notifyChannel(cfg.TablePrefix, topic)),
		unlisten: `UNLISTEN *`,
		newest:   `SELECT COALESCE(max(transaction_id)::text, '0') FROM ` + messages,
		position: `SELECT COALESCE(offset_acked, 0), last_processed_transaction_id, NULL::text, NULL::bigint FROM ` + offsets +
			` WHERE consumer_group = $1`,
		zero: insertZeroOffsets(cfg, topic),
		read: selectRows,
		// watermill-sql's AckMessageQuery, which never moves a group back.
		ack: `INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ($1, $2, $3::text::xid8)
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = excluded.offset_acked,
				last_processed_transaction_id = excluded.last_processed_transaction_id
			WHERE (o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
				(excluded.last_processed_transaction_id, excluded.offset_acked)`,
	}
	if !marking {
		return q
	}
	q.position = `SELECT COALESCE(offset_acked, 0), last_processed_transaction_id, ` + xid + `::text, ` + off + ` FROM ` + offsets +
		` WHERE consumer_group = $1`
	// The rows read, and in the same statement (one transaction, committed
	// before the rows are handed out) the last of them as the group's
	// handed-out position, and the acknowledged position ($5, $6): each
	// only ever moves forward here.
	acks := `(o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
			(excluded.last_processed_transaction_id, excluded.offset_acked)`
	handsOut := `(COALESCE(o.` + xid + `, '0'), COALESCE(o.` + off + `, 0)) < (excluded.` + xid + `, excluded.` + off + `)`
	q.read = `WITH r AS (` + selectRows + `),
		last AS (SELECT transaction_id, "offset" FROM r ORDER BY transaction_id DESC, "offset" DESC LIMIT 1),
		w AS (
			INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id, ` + xid + `, ` + off + `)
			SELECT $4::text, $5::bigint, $6::text::xid8, COALESCE(last.transaction_id, '0'), COALESCE(last."offset", 0)
			FROM (SELECT) AS one LEFT JOIN last ON true
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = CASE WHEN ` + acks + ` THEN excluded.offset_acked ELSE o.offset_acked END,
				last_processed_transaction_id = CASE WHEN ` + acks + `
					THEN excluded.last_processed_transaction_id ELSE o.last_processed_transaction_id END,
				` + xid + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + xid + ` ELSE o.` + xid + ` END,
				` + off + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + off + ` ELSE o.` + off + ` END
			WHERE ` + acks + ` OR ` + handsOut + `
		)
		SELECT "offset", transaction_id, uuid, payload, metadata FROM r ORDER BY transaction_id, "offset"`
	// On close: back to the last row this subscription handed out, when
	// it read further, so that the next one hands out the rest as first
	// deliveries.
	q.lower = `UPDATE ` + offsets + ` SET ` + xid + ` = $2::text::xid8, ` + off + ` = $3
		WHERE consumer_group = $1 AND (` + xid + `, ` + off + `) > ($2::text::xid8, $3)`
	return q
}
