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

	// qMarkManySQLite and qMarkManyPostgres mark a batch of events in one
	// statement (Store.markRows): the consumer, the time, then the keys,
	// as a JSON array of [source, id] pairs on SQLite (whose upsert needs
	// a WHERE on its SELECT), as two text arrays on PostgreSQL. The
	// statement returns the keys it inserted.
	qMarkManySQLite = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
SELECT ?, value ->> 0, value ->> 1, ? FROM json_each(?) WHERE true
ON CONFLICT (consumer, source, event_id) DO NOTHING RETURNING source, event_id`
	qMarkManyPostgres = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
SELECT ?, k.source, k.event_id, ? FROM unnest(?::text[], ?::text[]) AS k(source, event_id)
ON CONFLICT (consumer, source, event_id) DO NOTHING RETURNING source, event_id`

	// qCountConflict ends the count upserts: a delivery counted before
	// counts one more.
	qCountConflict = `ON CONFLICT (consumer, source, event_id) DO UPDATE SET count = {p}deliveries.count + 1
RETURNING consumer, source, event_id, count`
	// qCountManySQLite and qCountManyPostgres count a batch of deliveries
	// in one statement (Store.countRows): the time, then the deliveries,
	// as a JSON array of [consumer, source, id, first] arrays on SQLite,
	// as four arrays on PostgreSQL.
	qCountManySQLite = `INSERT INTO {p}deliveries (consumer, source, event_id, count, first_at)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, ? FROM json_each(?) WHERE true
` + qCountConflict
	qCountManyPostgres = `INSERT INTO {p}deliveries (consumer, source, event_id, count, first_at)
SELECT d.consumer, d.source, d.event_id, d.first, ? FROM unnest(?::text[], ?::text[], ?::text[], ?::bigint[]) AS d(consumer, source, event_id, first)
` + qCountConflict

	qForgetDelivery = `DELETE FROM {p}deliveries WHERE consumer = ? AND source = ? AND event_id = ?`
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
