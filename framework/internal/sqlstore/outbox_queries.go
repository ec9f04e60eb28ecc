package sqlstore

// The outbox's SQL, in SQLite's placeholders ("?") with {p} for the table
// prefix; queries.sql turns it into one dialect's and prefix's.
const (
	// qOutboxInsert records an event to publish. A second row of the same
	// (source, event_id) is not written: an event is added once.
	qOutboxInsert = `INSERT INTO {p}outbox (event_id, source, type, subject, subject_seq, body, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (source, event_id) DO NOTHING`

	outboxColumns = `id, event_id, source, type, subject, subject_seq, body, created_at`

	// qOutboxUnsent reads the oldest unsent rows, in id order, through
	// the partial index on unsent rows.
	qOutboxUnsent = `SELECT ` + outboxColumns + ` FROM {p}outbox
WHERE sent_at IS NULL ORDER BY id LIMIT ?`

	// qOutboxClaim is qOutboxUnsent on PostgreSQL inside a transaction:
	// it locks the rows it returns and skips rows that another relay has
	// locked, so two relays never publish the same row at the same time.
	qOutboxClaim = qOutboxUnsent + ` FOR UPDATE SKIP LOCKED`

	// qOutboxLease is the claim on SQLite, where a relay cannot hold the
	// write lock while it publishes: one short write takes a lease on the
	// oldest unsent rows that no other relay holds, and returns them. A
	// relay that dies holding a lease leaves its rows to the next one once
	// the lease ends. RETURNING gives no order: the caller sorts by id.
	qOutboxLease = `UPDATE {p}outbox SET claimed_until = ? WHERE id IN (
SELECT id FROM {p}outbox WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < ?)
ORDER BY id LIMIT ?)
RETURNING ` + outboxColumns

	// qOutboxRelease gives up the lease of rows a relay did not publish;
	// sqlx.In expands the id list.
	qOutboxRelease = `UPDATE {p}outbox SET claimed_until = NULL WHERE id IN (?) AND sent_at IS NULL`

	// qOutboxMarkSent marks rows sent; sqlx.In expands the id list.
	qOutboxMarkSent = `UPDATE {p}outbox SET sent_at = ? WHERE id IN (?) AND sent_at IS NULL`

	// qOutboxCleanup deletes a batch of the rows sent earliest, before a
	// time. It reads them through the index on sent rows' sent_at, so
	// that a cleanup reads no more rows than it deletes (ORDER BY id
	// walked every sent row kept when none was old enough).
	qOutboxCleanup = `DELETE FROM {p}outbox WHERE id IN (
SELECT id FROM {p}outbox WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)`
)
