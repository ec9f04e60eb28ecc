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

	// qOutboxClaim is the claim on PostgreSQL inside a transaction: it
	// locks up to a limit of the oldest unsent rows, skipping rows that
	// another relay has locked, so two relays never publish the same row
	// at the same time. Its arguments are a byte budget and the limit:
	// fits is true for the first row and for each next one whose body,
	// with those before it, comes to at most the budget, and only those
	// rows come with their body; the rest stay locked, unread, until the
	// transaction ends. A row's size is its body's octet_length, which
	// reads no TOASTed body; the running sum is taken over the locked rows
	// only, after the limit, so that it reads no more rows than the claim.
	// It runs after qIndexScansOnly in its transaction.
	qOutboxClaim = `SELECT id, event_id, source, type, subject, subject_seq, CASE WHEN fits THEN body END, created_at, fits FROM (
SELECT *, row_number() OVER w = 1 OR sum(octet_length(body)) OVER w <= ? AS fits FROM (
SELECT ` + outboxColumns + ` FROM {p}outbox WHERE sent_at IS NULL ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED) claimed
WINDOW w AS (ORDER BY id)) c
ORDER BY id`

	// qOutboxLease is the claim on SQLite, where a relay cannot hold the
	// write lock while it publishes: one short write takes a lease on the
	// oldest unsent rows that no other relay holds, and returns them. A
	// relay that dies holding a lease leaves its rows to the next one once
	// the lease ends. Its arguments are the lease's end, now, a limit and a
	// byte budget: of the oldest rows up to the limit, it leases those
	// that qOutboxClaim finds fit (the first, and each next one while the
	// bodies up to it come to at most the budget); octet_length reads a
	// body's size, not its overflow pages. RETURNING gives no order: the
	// caller sorts by id.
	qOutboxLease = `UPDATE {p}outbox SET claimed_until = ? WHERE id IN (
SELECT id FROM (
SELECT id, row_number() OVER w AS n, sum(size) OVER w AS upto FROM (
SELECT id, octet_length(body) AS size FROM {p}outbox WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < ?)
ORDER BY id LIMIT ?) WINDOW w AS (ORDER BY id))
WHERE n = 1 OR upto <= ?)
RETURNING ` + outboxColumns

	// qOutboxLeasable reports whether an unsent row after an id is not
	// leased (or its lease ended before now): what a lease cut short by
	// its byte budget left.
	qOutboxLeasable = `SELECT EXISTS (SELECT 1 FROM {p}outbox
WHERE sent_at IS NULL AND id > ? AND (claimed_until IS NULL OR claimed_until < ?))`

	// outboxUnsentRows is the condition of unsent rows in qOutboxClaim and
	// qOutboxLease, which a claim that skips event types extends with
	// qOutboxSkip or qOutboxProbe.
	outboxUnsentRows = `{p}outbox WHERE sent_at IS NULL`
	// qOutboxSkip leaves out the rows of event types (sqlx.In expands the
	// list): those the broker routes nowhere, whose rows must not hold up
	// the others.
	qOutboxSkip = outboxUnsentRows + ` AND type NOT IN (?)`
	// qOutboxProbe leaves out the rows of event types but the oldest
	// unsent row of each, which tries whether the broker routes it now.
	qOutboxProbe = outboxUnsentRows + ` AND (type NOT IN (?) OR id IN (
SELECT min(id) FROM {p}outbox WHERE sent_at IS NULL AND type IN (?) GROUP BY type))`

	// qOutboxUnsentOf counts the unsent rows of event types (sqlx.In
	// expands the list).
	qOutboxUnsentOf = `SELECT type, count(*) FROM {p}outbox WHERE sent_at IS NULL AND type IN (?) GROUP BY type`

	// qOutboxRelease gives up the lease of rows a relay did not publish.
	qOutboxRelease = `UPDATE {p}outbox SET claimed_until = NULL WHERE id ` + inIDs + ` AND sent_at IS NULL`

	// qOutboxMarkSent marks rows sent. Its ids are one argument (see
	// withIDList): one placeholder a row planned a batch of 1,000 in
	// 8.5 ms on PostgreSQL against 3, made each batch size a statement of
	// its own in a connection's cache, and, past 32,766 rows, failed on
	// SQLite.
	qOutboxMarkSent = `UPDATE {p}outbox SET sent_at = ? WHERE id ` + inIDs + ` AND sent_at IS NULL`

	// qOutboxCleanup deletes a batch of the rows sent earliest, before a
	// time. It reads them through the index on sent rows' sent_at, so
	// that a cleanup reads no more rows than it deletes (ORDER BY id
	// walked every sent row kept when none was old enough).
	qOutboxCleanup = `DELETE FROM {p}outbox WHERE id IN (
SELECT id FROM {p}outbox WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)`
)
