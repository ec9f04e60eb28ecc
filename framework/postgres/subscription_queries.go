package postgres

import "strconv"

// subscriptionQueries are the statements of one topic's subscription.
// lock, position and zero take the groups of the subscription's streams
// as an array: one group when the consumer is not partitioned, one per
// partition when it is. read and ack are the unpartitioned ones, with
// their partitioned forms in readParts and ackParts.
type subscriptionQueries struct {
	lock, unlock, position, read, ack, zero, lower string
	listen, unlisten, newest, lost, timeline       string
	readParts, ackParts                            string
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
	// 20,000 rows were behind it). Each row comes with its age (ageColumn).
	selectRows := `SELECT "offset", transaction_id, uuid, payload, metadata, ` + ageColumn + ` FROM ` + messages + `
			WHERE (transaction_id, "offset") > ($1::text::xid8, $2)
			AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY transaction_id, "offset" LIMIT $3`
	q := subscriptionQueries{
		// The key names the offsets table by its oid, so that the tables
		// of one name in other schemas have keys of their own; a group's
		// key is that of its row.
		lock: `SELECT g, k, pg_try_advisory_lock(k) FROM (SELECT g, hashtextextended(` +
			`$1::text::regclass::oid::text || '/' || g, 0) AS k FROM unnest($2::text[]) AS g) AS keys`,
		unlock:   `SELECT pg_advisory_unlock($1)`,
		listen:   `LISTEN ` + quoteIdent(notifyChannel(cfg.TablePrefix, topic)),
		unlisten: `UNLISTEN *`,
		newest:   `SELECT COALESCE(max(transaction_id)::text, '0') FROM ` + messages,
		// The database's timeline (the first 8 hex digits of a WAL file's
		// name), which a promotion or a point-in-time recovery moves on.
		timeline: `SELECT CASE WHEN pg_is_in_recovery() THEN '' ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END`,
		// The offsets of the rows (offset, transaction, uuid) that are
		// not there (see lostCursors).
		lost: `SELECT c.o FROM unnest($1::bigint[], $2::text[], $3::text[]) AS c(o, x, u)
			WHERE NOT EXISTS (SELECT FROM ` + messages + ` AS m WHERE m."offset" = c.o AND m.transaction_id = c.x::xid8 AND m.uuid = c.u)`,
		position: `SELECT consumer_group, COALESCE(offset_acked, 0), last_processed_transaction_id::text, NULL::text, NULL::bigint FROM ` +
			offsets + ` WHERE consumer_group = ANY($1::text[])`,
		// watermill-sql's row of a new group: from the first message.
		zero: `INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id)
			SELECT g, 0, '0' FROM unnest($1::text[]) AS g ON CONFLICT DO NOTHING`,
		read: selectRows,
		// watermill-sql's AckMessageQuery, which never moves a group back.
		ack: `INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ($1, $2, $3::text::xid8)
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = excluded.offset_acked,
				last_processed_transaction_id = excluded.last_processed_transaction_id
			WHERE (o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
				(excluded.last_processed_transaction_id, excluded.offset_acked)`,
		// The same, of many groups at once.
		ackParts: `INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id)
			SELECT g, a, x::xid8 FROM unnest($1::text[], $2::bigint[], $3::text[]) AS acked(g, a, x)
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = excluded.offset_acked,
				last_processed_transaction_id = excluded.last_processed_transaction_id
			WHERE (o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
				(excluded.last_processed_transaction_id, excluded.offset_acked)`,
	}
	if !marking {
		return q
	}
	q.position = `SELECT consumer_group, COALESCE(offset_acked, 0), last_processed_transaction_id::text, ` + xid + `::text, ` + off +
		` FROM ` + offsets + ` WHERE consumer_group = ANY($1::text[])`
	// The rows read, and in the same statement (one transaction, committed
	// before the rows are handed out) the last of them as the group's
	// handed-out position, and the acknowledged position ($5, $6): each
	// only ever moves forward here.
	q.read = `WITH r AS (` + selectRows + `),
		last AS (SELECT transaction_id, "offset" FROM r ORDER BY transaction_id DESC, "offset" DESC LIMIT 1),
		w AS (
			INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id, ` + xid + `, ` + off + `)
			SELECT $4::text, $5::bigint, $6::text::xid8, COALESCE(last.transaction_id, '0'), COALESCE(last."offset", 0)
			FROM (SELECT) AS one LEFT JOIN last ON true
			` + upsertPositions() + `
		)
		SELECT "offset", transaction_id, uuid, payload, metadata, age FROM r ORDER BY transaction_id, "offset"`
	// On close: back to the last row this subscription handed out, when
	// it read further, so that the next one hands out the rest as first
	// deliveries.
	q.lower = `UPDATE ` + offsets + ` SET ` + xid + ` = $2::text::xid8, ` + off + ` = $3
		WHERE consumer_group = $1 AND (` + xid + `, ` + off + `) > ($2::text::xid8, $3)`
	return q
}

// ageColumn is the column "age" of a row read (see ageOf).
var ageColumn = ageOf("created_at") + ` AS age`

// ageOf is the SQL expression of how long ago a row whose created_at
// column is col was published, in microseconds, by the server's clock.
// created_at is watermill-sql's "timestamp without time zone", written
// with the server's now(): compared with the same, the age holds whatever
// the Go clocks of the publisher and the subscriber say (see
// publishedAt). It is NULL for a created_at of 'infinity' or '-infinity',
// which a producer may write and which PostgreSQL cannot subtract: the
// read that delivers such a row, and every one after it, would fail.
func ageOf(col string) string {
	return `CASE WHEN isfinite(` + col + `) THEN (EXTRACT(EPOCH FROM (now()::timestamp - ` + col + `)) * 1000000)::bigint END`
}

// upsertPositions ends the read's write of a group's positions: the
// acknowledged one and the handed-out one each only ever move forward.
func upsertPositions() string {
	xid, off := handedOutColumns[0], handedOutColumns[1]
	acks := `(o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
			(excluded.last_processed_transaction_id, excluded.offset_acked)`
	handsOut := `(COALESCE(o.` + xid + `, '0'), COALESCE(o.` + off + `, 0)) < (excluded.` + xid + `, excluded.` + off + `)`
	return `ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = CASE WHEN ` + acks + ` THEN excluded.offset_acked ELSE o.offset_acked END,
				last_processed_transaction_id = CASE WHEN ` + acks + `
					THEN excluded.last_processed_transaction_id ELSE o.last_processed_transaction_id END,
				` + xid + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + xid + ` ELSE o.` + xid + ` END,
				` + off + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + off + ` ELSE o.` + off + ` END
			WHERE ` + acks + ` OR ` + handsOut
}

// partitionQueries returns the statements of topic's subscription for a
// consumer of n partitions (which marks: see handedOutColumns).
//
// readParts reads, in one statement, the rows after each partition's
// position ($1 partitions, $2 their groups, $3 and $4 their positions, $5
// how many rows each at most), each partition's through the index of n
// partitions (bucketIndex: an index range scan however deep the backlog),
// and writes the positions of the partitions that read rows or whose
// acknowledged position ($6, $7) moved ($8), as the unpartitioned read
// does for its group. Its last row, of partition -1, carries the
// statement's visibility horizon as its transaction id: every transaction
// below it has ended, its rows visible.
func partitionQueries(cfg TransportConfig, topic string, n int) subscriptionQueries {
	q := newSubscriptionQueries(cfg, topic, true)
	messages, offsets := MessagesTable(cfg.TablePrefix, topic), OffsetsTable(cfg.TablePrefix, topic)
	xid, off := handedOutColumns[0], handedOutColumns[1]
	q.readParts = `WITH p AS (
			SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::bigint[], $5::int[], $6::bigint[], $7::text[], $8::bool[])
				AS p(part, grp, xid, off, lim, acked_off, acked_xid, dirty)
		),
		r AS (
			SELECT p.part, p.grp, m."offset", m.transaction_id, m.uuid, m.payload, m.metadata, m.age
			FROM p CROSS JOIN LATERAL (
				SELECT "offset", transaction_id, uuid, payload, metadata, ` + ageColumn + ` FROM ` + messages + `
				WHERE (` + bucketExpr + ` % ` + strconv.Itoa(n) + `) = p.part
				AND (transaction_id, "offset") > (p.xid::xid8, p.off)
				AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
				ORDER BY transaction_id, "offset" LIMIT p.lim
			) AS m
		),
		last AS (SELECT DISTINCT ON (grp) grp, transaction_id, "offset" FROM r ORDER BY grp, transaction_id DESC, "offset" DESC),
		w AS (
			INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id, ` + xid + `, ` + off + `)
			SELECT p.grp, p.acked_off, p.acked_xid::xid8, COALESCE(last.transaction_id, '0'), COALESCE(last."offset", 0)
			FROM p LEFT JOIN last ON last.grp = p.grp
			WHERE p.dirty OR last.grp IS NOT NULL
			` + upsertPositions() + `
		)
		SELECT part, "offset", transaction_id, uuid, payload, metadata, age FROM r
		UNION ALL SELECT -1, 0, pg_snapshot_xmin(pg_current_snapshot()), '', NULL, NULL, NULL
		ORDER BY transaction_id, "offset"`
	return q
}
