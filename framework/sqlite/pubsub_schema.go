package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// The Pub/Sub's tables, without the prefix. They are the transport's own;
// docs/transports.md documents them for programs that publish by hand.
const (
	// PubSubMessagesTable holds every published message that some known
	// consumer group has not acknowledged yet.
	PubSubMessagesTable = "pubsub_messages"
	// PubSubGroupsTable holds one row per (topic, consumer group): the
	// highest offset the group has claimed so far.
	PubSubGroupsTable = "pubsub_groups"
	// PubSubLeasesTable holds one row per (topic, consumer group, message)
	// claimed and not yet acknowledged.
	PubSubLeasesTable = "pubsub_leases"
)

// nowMillis is the SQL expression of the Pub/Sub tables' created_at
// default: the current Unix time in milliseconds. It is computed with
// julianday, which every SQLite has; unixepoch came with SQLite 3.38 and
// its 'subsec' modifier with 3.42, so a program on an older SQLite (Debian
// 12's sqlite3 3.40, or Python's sqlite3 module there) could not insert a
// row that relied on the default.
const nowMillis = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

// millisOf is the SQL expression of the created_at column col as read: an
// integer as it is, a real (what julianday gives without the default's
// CAST) cut to an integer, and NULL for anything else a producer may have
// written (a text, a blob), so that no row's created_at fails the reads
// that deliver it or measure the backlog: SQLite keeps any value in an
// INTEGER column.
func millisOf(col string) string {
	return `CASE typeof(` + col + `) WHEN 'integer' THEN ` + col + ` WHEN 'real' THEN CAST(` + col + ` AS INTEGER) END`
}

// pubsubQueries holds the SQL of the Pub/Sub with the table prefix applied.
// Lists of offsets travel as one JSON array argument read by json_each, so
// every statement has a fixed text.
type pubsubQueries struct {
	messages, groups string // the two tables that have a created_at default
	schema           []string

	insert        string // one message: topic, uuid, payload, metadata, created_at
	registerGroup string // topic, group, created_at
	groupKnown    string // topic, group
	anyDue        string // ?1 topic, ?2 group, ?3 now
	newestOffset  string // -> the newest offset, 0 when none
	claimedOffset string // topic, group
	setClaimed    string // offset, topic, group
	claimNew      string // topic, after, limit: offsets
	selectNew     string // topic, after, last: messages
	insertLeases  string // topic, group, locked_until, offsets
	reclaim       string // locked_until, topic, group, now, limit
	selectByOff   string // offsets
	ack           string // topic, group, offsets
	ackOne        string // topic, group, offset
	release       string // locked_until, topic, group, offsets
	renew         string // ?1 locked_until, ?2 topic, ?3 group, ?4 [[offset, deliveries], ...]
	unclaim       string // topic, group, offsets
	horizons      string // -> topic, horizon
	cleanup       string // topic, horizon, limit
}

// createMessagesTable returns the CREATE TABLE statement of the messages
// table named name.
func createMessagesTable(name string) string {
	return `CREATE TABLE IF NOT EXISTS ` + name + ` (
	"offset"   INTEGER PRIMARY KEY AUTOINCREMENT,
	topic      TEXT    NOT NULL,
	uuid       TEXT    NOT NULL DEFAULT '',
	payload    BLOB    NOT NULL,
	metadata   TEXT    NOT NULL DEFAULT '{}',
	created_at INTEGER NOT NULL DEFAULT (` + nowMillis + `)
)`
}

// createGroupsTable returns the CREATE TABLE statement of the groups table
// named name.
func createGroupsTable(name string) string {
	return `CREATE TABLE IF NOT EXISTS ` + name + ` (
	topic          TEXT    NOT NULL,
	consumer_group TEXT    NOT NULL,
	claimed_offset INTEGER NOT NULL DEFAULT 0,
	created_at     INTEGER NOT NULL DEFAULT (` + nowMillis + `),
	PRIMARY KEY (topic, consumer_group)
) WITHOUT ROWID`
}

func newPubSubQueries(prefix string) pubsubQueries {
	r := strings.NewReplacer(
		"{messages}", prefix+PubSubMessagesTable,
		"{groups}", prefix+PubSubGroupsTable,
		"{leases}", prefix+PubSubLeasesTable,
		"{prefix}", prefix,
	)
	q := func(s string) string { return r.Replace(s) }
	return pubsubQueries{
		messages: prefix + PubSubMessagesTable,
		groups:   prefix + PubSubGroupsTable,
		schema: []string{
			createMessagesTable(prefix + PubSubMessagesTable),
			q(`CREATE INDEX IF NOT EXISTS {prefix}pubsub_messages_topic_offset ON {messages} (topic, "offset")`),
			createGroupsTable(prefix + PubSubGroupsTable),
			q(`CREATE TABLE IF NOT EXISTS {leases} (
	topic          TEXT    NOT NULL,
	consumer_group TEXT    NOT NULL,
	"offset"       INTEGER NOT NULL,
	deliveries     INTEGER NOT NULL,
	locked_until   INTEGER NOT NULL,
	PRIMARY KEY (topic, consumer_group, "offset")
) WITHOUT ROWID`),
			// The leases of a group are few (those in flight and those
			// nacked), so a claim finds those due by the primary key; an
			// index on locked_until cost every claim, ack and renewal a
			// second b-tree write. Earlier releases created one.
			q(`DROP INDEX IF EXISTS {prefix}pubsub_leases_due`),
		},
		insert: q(`INSERT INTO {messages} (topic, uuid, payload, metadata, created_at) VALUES (?, ?, ?, ?, ?)`),
		registerGroup: q(`INSERT INTO {groups} (topic, consumer_group, claimed_offset, created_at) VALUES (?, ?, 0, ?)
	ON CONFLICT (topic, consumer_group) DO NOTHING`),
		groupKnown: q(`SELECT EXISTS (SELECT 1 FROM {groups} WHERE topic = ? AND consumer_group = ?)`),
		anyDue: q(`SELECT EXISTS (
		SELECT 1 FROM {messages} WHERE topic = ?1 AND "offset" > COALESCE(
			(SELECT claimed_offset FROM {groups} WHERE topic = ?1 AND consumer_group = ?2), 0))
	OR EXISTS (
		SELECT 1 FROM {leases} WHERE topic = ?1 AND consumer_group = ?2 AND locked_until <= ?3)`),
		newestOffset:  q(`SELECT COALESCE(max("offset"), 0) FROM {messages}`),
		claimedOffset: q(`SELECT claimed_offset FROM {groups} WHERE topic = ? AND consumer_group = ?`),
		setClaimed:    q(`UPDATE {groups} SET claimed_offset = ? WHERE topic = ? AND consumer_group = ?`),
		claimNew: q(`SELECT "offset" FROM {messages}
	WHERE topic = ? AND "offset" > ? ORDER BY "offset" LIMIT ?`),
		selectNew: q(`SELECT "offset", uuid, payload, metadata, ` + millisOf("created_at") + ` FROM {messages}
	WHERE topic = ? AND "offset" > ? AND "offset" <= ? ORDER BY "offset"`),
		insertLeases: q(`INSERT INTO {leases} (topic, consumer_group, "offset", deliveries, locked_until)
	SELECT ?, ?, value, 1, ? FROM json_each(?)`),
		reclaim: q(`UPDATE {leases} SET deliveries = deliveries + 1, locked_until = ?1
	WHERE topic = ?2 AND consumer_group = ?3 AND "offset" IN (
		SELECT "offset" FROM {leases} WHERE topic = ?2 AND consumer_group = ?3 AND locked_until <= ?4
		ORDER BY "offset" LIMIT ?5)
	RETURNING "offset", deliveries`),
		selectByOff: q(`SELECT "offset", uuid, payload, metadata, ` + millisOf("created_at") + ` FROM {messages}
	WHERE "offset" IN (SELECT value FROM json_each(?)) ORDER BY "offset"`),
		ack: q(`DELETE FROM {leases} WHERE topic = ? AND consumer_group = ?
	AND "offset" IN (SELECT value FROM json_each(?))`),
		ackOne: q(`DELETE FROM {leases} WHERE topic = ? AND consumer_group = ? AND "offset" = ?`),
		release: q(`UPDATE {leases} SET locked_until = ? WHERE topic = ? AND consumer_group = ?
	AND "offset" IN (SELECT value FROM json_each(?))`),
		renew: q(`UPDATE {leases} SET locked_until = ?1
	WHERE topic = ?2 AND consumer_group = ?3 AND ("offset", deliveries) IN (
		SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?4))`),
		unclaim: q(`UPDATE {leases} SET locked_until = 0, deliveries = MAX(deliveries - 1, 0)
	WHERE topic = ? AND consumer_group = ? AND "offset" IN (SELECT value FROM json_each(?))`),
		horizons: q(`SELECT g.topic, MIN(COALESCE(
		(SELECT MIN(l."offset") FROM {leases} l WHERE l.topic = g.topic AND l.consumer_group = g.consumer_group),
		g.claimed_offset + 1))
	FROM {groups} g GROUP BY g.topic`),
		cleanup: q(`DELETE FROM {messages} WHERE "offset" IN (
	SELECT "offset" FROM {messages} WHERE topic = ? AND "offset" < ? ORDER BY "offset" LIMIT ?)`),
	}
}

// initializeSchema creates the Pub/Sub's tables when they are missing and
// upgrades those an earlier release created (see upgradeSchema), in one
// transaction.
func (q pubsubQueries) initializeSchema(ctx context.Context, db *sqlx.DB) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("initialize pubsub schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if err := q.upgradeSchema(ctx, tx); err != nil {
		return fmt.Errorf("initialize pubsub schema: %w", err)
	}
	for _, stmt := range q.schema {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("initialize pubsub schema: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("initialize pubsub schema: %w", err)
	}
	return nil
}

// upgradeSchema rebuilds, keeping their rows, the messages and groups
// tables that an earlier release created with a created_at default of
// unixepoch('subsec'), which SQLite before 3.42 cannot compute: a program
// on such a SQLite that inserted a message by hand failed. SQLite cannot
// alter a column's default, so each such table is copied into a new one,
// dropped, and the new one renamed; the messages table keeps its
// AUTOINCREMENT sequence, so no offset is handed out twice. The indexes are
// created again by the schema statements that follow. tx holds the file's
// write lock (BEGIN IMMEDIATE), so two processes never rebuild at once.
func (q pubsubQueries) upgradeSchema(ctx context.Context, tx *sqlx.Tx) error {
	for _, t := range []struct {
		name, columns string
		autoincrement bool
		create        func(string) string
	}{
		{q.messages, `"offset", topic, uuid, payload, metadata, created_at`, true, createMessagesTable},
		{q.groups, `topic, consumer_group, claimed_offset, created_at`, false, createGroupsTable},
	} {
		var ddl string
		err := tx.GetContext(ctx, &ddl, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?`, t.name)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read the definition of %s: %w", t.name, err)
		}
		if !strings.Contains(ddl, "unixepoch(") {
			continue
		}
		if err := rebuildTable(ctx, tx, t.name, t.columns, t.autoincrement, t.create); err != nil {
			return fmt.Errorf("rebuild %s with a created_at default every SQLite computes: %w", t.name, err)
		}
	}
	return nil
}

// rebuildTable replaces the table name by one that create defines, with
// the same rows (columns lists them) and, when it has one, the same
// AUTOINCREMENT sequence.
func rebuildTable(ctx context.Context, tx *sqlx.Tx, name, columns string, autoincrement bool, create func(string) string) error {
	var seq []int64
	if autoincrement {
		if err := tx.SelectContext(ctx, &seq, `SELECT seq FROM sqlite_sequence WHERE name = ?`, name); err != nil {
			return fmt.Errorf("read the offset sequence: %w", err)
		}
	}
	tmp := name + "_rebuild"
	for _, stmt := range []string{
		create(tmp),
		`INSERT INTO ` + tmp + ` (` + columns + `) SELECT ` + columns + ` FROM ` + name,
		`DROP TABLE ` + name,
		`ALTER TABLE ` + tmp + ` RENAME TO ` + name,
	} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if len(seq) == 0 {
		return nil
	}
	// The copy set the sequence to the highest offset copied; the old one
	// may be higher (messages every group acknowledged are deleted).
	res, err := tx.ExecContext(ctx, `UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = ?`, seq[0], name)
	if err != nil {
		return fmt.Errorf("keep the offset sequence: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)`, name, seq[0]); err != nil {
			return fmt.Errorf("keep the offset sequence: %w", err)
		}
	}
	return nil
}

// InitializePubSubSchema creates the tables of the SQLite Pub/Sub with the
// given prefix when they are missing, and upgrades those an earlier release
// created (their rows kept). Publishers and Subscribers do it on first use
// unless their config says SkipSchemaInit; a migration tool can call it
// instead.
func InitializePubSubSchema(ctx context.Context, db *sqlx.DB, tablePrefix string) error {
	if err := validatePubSubPrefix("InitializePubSubSchema", tablePrefix); err != nil {
		return err
	}
	return newPubSubQueries(tablePrefix).initializeSchema(ctx, db)
}

// pubsubSchemaOnce runs the schema initialisation of one Publisher or
// Subscriber until it succeeds once.
type pubsubSchemaOnce struct {
	skip bool
	done bool
	mu   chan struct{} // a one-slot lock that honours ctx
}

func newPubSubSchemaOnce(skip bool) *pubsubSchemaOnce {
	return &pubsubSchemaOnce{skip: skip, mu: make(chan struct{}, 1)}
}

func (o *pubsubSchemaOnce) ensure(ctx context.Context, db *sqlx.DB, q pubsubQueries) error {
	if o.skip {
		return nil
	}
	select {
	case o.mu <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("initialize pubsub schema: %w", ctx.Err())
	}
	defer func() { <-o.mu }()
	if o.done {
		return nil
	}
	if err := q.initializeSchema(ctx, db); err != nil {
		return err
	}
	o.done = true
	return nil
}
