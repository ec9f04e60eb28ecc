package sqlstore

import (
	"strings"

	"github.com/jmoiron/sqlx"
)

// The store's SQL. "{p}" stands for the table prefix; placeholders are
// written as "?" and rebound for the dialect. Both dialects support
// INSERT ... ON CONFLICT and RETURNING.
const (
	// On PostgreSQL, ON CONFLICT DO NOTHING waits for a concurrent
	// transaction that inserted the same key: when it commits, nothing is
	// inserted (a duplicate); when it rolls back, this insert goes ahead.
	// On SQLite, the transaction holds the file's write lock since BEGIN
	// IMMEDIATE, so no other mark can be in flight.
	qMark = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
VALUES (?, ?, ?, ?)
ON CONFLICT (consumer, source, event_id) DO NOTHING`

	qForgetDelivery = `DELETE FROM {p}deliveries WHERE consumer = ? AND source = ? AND event_id = ?`

	// A repeat of a dead letter updates its row: the latest failure's
	// code, attempts, time and message, one more repeat, and pending again
	// (an earlier resolution is cleared) so that an operator sees it.
	qPublishDeadLetter = `INSERT INTO {p}dead_letters (
    consumer, topic, source, event_id, type, version, subject, correlation_id,
    code, attempts, repeats, first_failed_at, last_failed_at, body, metadata, status)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, 'pending')
ON CONFLICT (consumer, source, event_id) DO UPDATE SET
    topic = excluded.topic,
    type = excluded.type,
    version = excluded.version,
    subject = excluded.subject,
    correlation_id = excluded.correlation_id,
    code = excluded.code,
    attempts = excluded.attempts,
    repeats = {p}dead_letters.repeats + 1,
    last_failed_at = excluded.last_failed_at,
    body = excluded.body,
    metadata = excluded.metadata,
    status = 'pending',
    resolved_by = NULL,
    resolved_at = NULL,
    resolve_reason = NULL`

	deadLetterColumns = `id, consumer, topic, source, event_id, type, version, subject, correlation_id,
    code, attempts, repeats, first_failed_at, last_failed_at, body, metadata, status,
    resolved_by, resolved_at, resolve_reason`

	qDeadLetter = `SELECT ` + deadLetterColumns + ` FROM {p}dead_letters WHERE id = ?`

	// qDeadLetters takes the filter's conditions (those set) and ends with
	// qDeadLettersOrder.
	qDeadLetters         = `SELECT ` + deadLetterColumns + ` FROM {p}dead_letters WHERE id > ?`
	qDeadLettersConsumer = ` AND consumer = ?`
	qDeadLettersCode     = ` AND code = ?`
	qDeadLettersStatus   = ` AND status = ?`
	qDeadLettersOrder    = ` ORDER BY id LIMIT ?`

	qResolveDeadLetter = `UPDATE {p}dead_letters
SET status = ?, resolved_by = ?, resolved_at = ?, resolve_reason = ?
WHERE id = ? AND status = 'pending'`
)

// queries turns the store's SQL into one dialect's and prefix's.
type queries struct {
	prefix *strings.Replacer
	bind   int
}

func newQueries(d Dialect, prefix string) queries {
	return queries{prefix: strings.NewReplacer("{p}", prefix), bind: d.bindType()}
}

// sql returns s with the prefix and the dialect's placeholders.
func (q queries) sql(s string) string { return sqlx.Rebind(q.bind, q.prefix.Replace(s)) }
