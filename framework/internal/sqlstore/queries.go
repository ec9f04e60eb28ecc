package sqlstore

import (
	"strings"

	"github.com/jmoiron/sqlx"
)

// The store's SQL. "{p}" stands for the table prefix; placeholders are
// written as "?" and rebound for the dialect. Both dialects support
// INSERT ... ON CONFLICT and RETURNING.
const (
	// A mark (qMarkSQLite, qMarkPostgres) and a batch's marks
	// (Store.markRows) are qMarkInto, the rows as k, then qMarkConflict.
	// On PostgreSQL, ON CONFLICT DO NOTHING waits for a concurrent
	// transaction that inserted the same key: when it commits, nothing is
	// inserted (a duplicate); when it rolls back, this insert goes ahead.
	// On SQLite, the transaction holds the file's write lock since BEGIN
	// IMMEDIATE, so no other mark can be in flight.
	//
	// A mark is taken only where the consumer's dead letter of the event,
	// if any, is not discarded (notDiscarded): an operator who discards a
	// dead letter settles its event for good, so a copy of it that comes
	// later (a redelivery, a producer's second publish) is not processed,
	// as a duplicate is not. The batch's statement returns the keys it
	// inserted: not marked before, nor discarded.
	qMarkInto = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
SELECT k.consumer, k.source, k.event_id, k.at FROM `
	qMarkConflict = `WHERE ` + notDiscarded + `
ON CONFLICT (consumer, source, event_id) DO NOTHING`
	qMarkReturning = qMarkConflict + ` RETURNING source, event_id`
	// notDiscarded is the condition, on a row k of (consumer, source,
	// event_id), that the consumer's dead letter of the event is not
	// discarded: one lookup in the dead letters' unique index a row (a
	// scalar subquery, which the planner cannot turn into a join that
	// reads every dead letter).
	notDiscarded = `COALESCE((SELECT d.status FROM {p}dead_letters d
WHERE d.consumer = k.consumer AND d.source = k.source AND d.event_id = k.event_id), '') <> 'discarded'`
	// qMarkSQLite and qMarkPostgres mark one event: the consumer, the
	// key, the time. PostgreSQL takes a subquery's untyped parameters for
	// text: its row is typed.
	qMarkSQLite = qMarkInto + `(SELECT ? AS consumer, ? AS source, ? AS event_id, ? AS at) AS k
` + qMarkConflict
	qMarkPostgres = qMarkInto + `(SELECT ?::text AS consumer, ?::text AS source, ?::text AS event_id, ?::timestamptz AS at) AS k
` + qMarkConflict
	// qMarkManySQLite and qMarkManyPostgres mark a batch of events in one
	// statement: the consumer, the time, then the keys, as a JSON array of
	// [source, id] pairs on SQLite (whose upsert needs a WHERE on its
	// SELECT, which qMarkConflict has), as two text arrays on PostgreSQL.
	qMarkManySQLite = qMarkInto + `(SELECT c.consumer, j.value ->> 0 AS source, j.value ->> 1 AS event_id, c.at
FROM (SELECT ? AS consumer, ? AS at) AS c, json_each(?) AS j) AS k
` + qMarkReturning
	qMarkManyPostgres = qMarkInto + `(SELECT c.consumer, u.source, u.event_id, c.at
FROM (SELECT ?::text AS consumer, ?::timestamptz AS at) AS c, unnest(?::text[], ?::text[]) AS u(source, event_id)) AS k
` + qMarkReturning

	// A batch's delivery counts (Store.countRows) are qCountInto, the
	// rows, then qCountConflict: a delivery counted before counts one
	// more, unless its row's first is 0 (a delivery handed back
	// unhandled, which counts nothing: driver.Store.Count).
	qCountInto     = `INSERT INTO {p}deliveries (consumer, source, event_id, count, first_at)`
	qCountConflict = `ON CONFLICT (consumer, source, event_id) DO UPDATE SET count = {p}deliveries.count + CASE WHEN excluded.count > 0 THEN 1 ELSE 0 END
RETURNING consumer, source, event_id, count`
	// qCountManySQLite and qCountManyPostgres count a batch of deliveries
	// in one statement: the time, then the deliveries, as a JSON array of
	// [consumer, source, id, first] arrays on SQLite, as four arrays on
	// PostgreSQL.
	qCountManySQLite = qCountInto + `
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, ? FROM json_each(?) WHERE true
` + qCountConflict
	qCountManyPostgres = qCountInto + `
SELECT d.consumer, d.source, d.event_id, d.first, ? FROM unnest(?::text[], ?::text[], ?::text[], ?::bigint[]) AS d(consumer, source, event_id, first)
` + qCountConflict

	// qUncount takes back one delivery (Store.Uncount): never below
	// zero; a new count starts at zero.
	qUncount = qCountInto + ` VALUES (?, ?, ?, 0, ?)
ON CONFLICT (consumer, source, event_id) DO UPDATE SET count = CASE WHEN {p}deliveries.count > 0 THEN {p}deliveries.count - 1 ELSE 0 END`

	qForgetDelivery = `DELETE FROM {p}deliveries WHERE consumer = ? AND source = ? AND event_id = ?`
	// qZeroDelivery sets a count to zero, creating it at zero when
	// missing (Store.WaitGap): the redelivery, which the transport flags,
	// then counts as the first.
	qZeroDelivery = qCountInto + ` VALUES (?, ?, ?, 0, ?)
ON CONFLICT (consumer, source, event_id) DO UPDATE SET count = 0`
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
